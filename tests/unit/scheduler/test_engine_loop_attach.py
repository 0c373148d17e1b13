"""Attaching workers: the engine loop builds its Scheduler from what the workers said in their
hellos, the block size and the per-step token budget included when the scheduler was given
none."""

from __future__ import annotations

import asyncio

from services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from shared.config import CacheConfig, SchedulerConfig
from shared.protocol import WorkerHello


def make_loop(
    cache_config: CacheConfig, scheduler_config: SchedulerConfig | None = None
) -> EngineLoop:
    return EngineLoop(
        EngineLoopConfig(
            engine_id="e1",
            redis_url="redis://127.0.0.1:1/0",  # never contacted
            namespace="test",
            plan_address="tcp://127.0.0.1:1",  # never bound: the link is not started
            result_address="tcp://127.0.0.1:2",
            scheduler_config=scheduler_config or SchedulerConfig(),
            cache_config=cache_config,
        )
    )


def attach(loop: EngineLoop, hello: WorkerHello) -> None:
    """What the link does on an accepted hello from the only rank."""
    loop.link._on_hello(hello)
    assert loop.link.is_ready
    assert asyncio.run(loop._attach_workers())


def test_the_scheduler_adopts_the_workers_block_size() -> None:
    loop = make_loop(CacheConfig())
    attach(loop, WorkerHello(0, 1, num_blocks=40, block_size=8, max_model_len=512,
                             model="fake", pid=1))  # fmt: skip
    assert loop.scheduler is not None
    assert (loop.scheduler.block_size, loop.scheduler.num_blocks) == (8, 40)
    assert loop.scheduler.kv.block_size == 8


def test_an_explicit_block_size_is_kept() -> None:
    loop = make_loop(CacheConfig(block_size=32))
    attach(loop, WorkerHello(0, 1, num_blocks=40, block_size=32, max_model_len=512,
                             model="fake", pid=1))  # fmt: skip
    assert loop.scheduler is not None and loop.scheduler.block_size == 32


def test_the_scheduler_adopts_the_workers_token_budget() -> None:
    loop = make_loop(CacheConfig())
    attach(loop, WorkerHello(0, 1, num_blocks=40, block_size=8, max_model_len=512,
                             model="fake", pid=1, max_num_batched_tokens=512))  # fmt: skip
    assert loop.scheduler is not None
    assert loop.scheduler.config.max_num_batched_tokens == 512
    assert loop._read_budget() > 0  # reads the built Scheduler's config, not the unset one


def test_an_explicit_token_budget_is_kept() -> None:
    loop = make_loop(CacheConfig(), SchedulerConfig(max_num_batched_tokens=4096))
    attach(loop, WorkerHello(0, 1, num_blocks=40, block_size=8, max_model_len=512,
                             model="fake", pid=1, max_num_batched_tokens=512))  # fmt: skip
    assert loop.scheduler is not None
    assert loop.scheduler.config.max_num_batched_tokens == 4096
