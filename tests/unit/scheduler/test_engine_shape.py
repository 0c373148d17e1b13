"""The engine's shape, derived once from the workers' hellos and the flags: the block size and
the per-step token budget are the flags' when given, else rank 0's; the cache is what every
rank holds; the length limit the smallest. The scheduler process builds its Scheduler from it."""

from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from pagedserve.services.scheduler.engine_shape import EngineShape
from pagedserve.shared.config import (
    CacheConfig,
    SchedulerConfig,
    default_num_speculative_tokens,
)
from pagedserve.shared.protocol import WorkerHello


def hello(rank: int = 0, world_size: int = 1, **fields: int) -> WorkerHello:
    values = dict(num_blocks=40, block_size=8, max_model_len=512, max_num_batched_tokens=512,
                  vocab_size=1000) | fields  # fmt: skip
    return WorkerHello(rank=rank, world_size=world_size, model="fake", pid=1, **values)


def test_without_flags_rank_0_sets_block_size_and_budget_and_the_smallest_cache_wins() -> None:
    hellos = [
        hello(1, 2, num_blocks=30, max_num_batched_tokens=2048, max_model_len=256),
        hello(0, 2, num_blocks=50),
    ]
    shape = EngineShape.derive(hellos, SchedulerConfig(), CacheConfig())
    assert shape == EngineShape(block_size=8, num_blocks=30, max_num_batched_tokens=512,
                                max_model_len=256, vocab_size=1000)  # fmt: skip


def test_flags_win_and_the_length_limit_is_the_smallest() -> None:
    shape = EngineShape.derive(
        [hello(block_size=32)],
        SchedulerConfig(max_num_batched_tokens=4096, max_model_len=100),
        CacheConfig(block_size=32),
    )
    assert (shape.block_size, shape.max_num_batched_tokens, shape.max_model_len) == (32, 4096, 100)
    assert shape.cache_config(CacheConfig(block_size=32)).num_blocks == 40
    assert shape.scheduler_config(SchedulerConfig()).max_num_batched_tokens == 4096


@pytest.mark.parametrize(("flag", "want"), [(None, 3), (0, 0), (5, 5)])
def test_draft_count_is_the_flag_when_given_else_rank_0s_device_default(flag, want) -> None:
    hellos = [hello(1, 2, num_speculative_tokens=0), hello(0, 2, num_speculative_tokens=3)]
    flags = SchedulerConfig(num_speculative_tokens=flag)
    shape = EngineShape.derive(hellos, flags, CacheConfig())
    assert shape.num_speculative_tokens == want
    assert shape.scheduler_config(flags).num_speculative_tokens == want


def test_device_defaults_draft_on_the_cpu_only() -> None:
    assert default_num_speculative_tokens("cpu") == 3
    assert default_num_speculative_tokens("cuda") == 0


def test_no_hello_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one worker hello"):
        EngineShape.derive([], SchedulerConfig(), CacheConfig())


def make_loop(cache_config: CacheConfig, scheduler_config: SchedulerConfig) -> EngineLoop:
    return EngineLoop(
        EngineLoopConfig(
            engine_id="e1",
            redis_url="redis://127.0.0.1:1/0",  # never answers: status writes fail quietly
            namespace="test",
            plan_address="tcp://127.0.0.1:1",  # never bound: the link is not started
            result_address="tcp://127.0.0.1:2",
            scheduler_config=scheduler_config,
            cache_config=cache_config,
        )
    )


def test_the_scheduler_process_builds_its_scheduler_from_the_shape() -> None:
    async def attach() -> tuple:
        loop = make_loop(CacheConfig(), SchedulerConfig(max_model_len=300))
        loop.link._on_hello(hello(max_num_batched_tokens=256))  # what the link does on a hello
        scheduler = await loop.attach()
        await loop.redis.aclose()
        loop.link._context.term()
        return scheduler, loop.link

    scheduler, link = asyncio.run(attach())
    assert (scheduler.block_size, scheduler.num_blocks, scheduler.vocab_size) == (8, 40, 1000)
    assert scheduler.config.max_num_batched_tokens == 256
    assert scheduler.config.max_model_len == 300
    assert (link.block_size, link.min_num_blocks) == (8, 40)  # later ranks must hold it


def test_the_window_blocks_slide_out_of_is_the_widest_when_every_layer_has_one():
    from pagedserve.shared.config import CacheConfig, SchedulerConfig

    def shape(windows):
        hello = WorkerHello(0, 1, 100, 16, 2048, "fake", 1, sliding_windows=windows)
        return EngineShape.derive([hello], SchedulerConfig(), CacheConfig())

    assert shape([8, 16, 8]).cache_config(CacheConfig()).sliding_window == 16
    assert shape([8, None]).sliding_window is None  # a full-attention layer reads everything
    assert shape([]).sliding_window is None
