"""The engine loop's intake list is shared by the main loop and the claim task: an entry one
of them adds while the other awaits Redis must never be lost (a lost entry is a request that
hangs forever)."""

from __future__ import annotations

import asyncio

from services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from services.scheduler.scheduler import Scheduler
from shared.config import CacheConfig, SchedulerConfig


class BlockingIO:
    """Stands in for RedisIO: read_new waits until released, then returns its entries."""

    def __init__(self, entries: list[str]) -> None:
        self.entries = entries
        self.release = asyncio.Event()
        self.reading = asyncio.Event()

    async def read_new(self, count: int, block_ms: int | None) -> list[str]:
        self.reading.set()
        await self.release.wait()
        return self.entries

    async def read_aborts(self) -> list[str]:
        return []


def make_loop() -> EngineLoop:
    loop = EngineLoop(
        EngineLoopConfig(
            engine_id="e1",
            redis_url="redis://127.0.0.1:1/0",  # never contacted
            namespace="test",
            plan_address="tcp://127.0.0.1:1",
            result_address="tcp://127.0.0.1:2",
            scheduler_config=SchedulerConfig(max_num_batched_tokens=2048),
            cache_config=CacheConfig(block_size=16, num_blocks=8),
        )
    )
    loop.scheduler = Scheduler(loop.config.scheduler_config, loop.config.cache_config)
    return loop


def test_entries_added_while_a_read_is_pending_are_kept():
    async def run() -> list:
        loop = make_loop()
        io = BlockingIO(["read"])
        loop.io = io
        reader = asyncio.create_task(loop._read_intake(block_ms=100))
        await asyncio.wait_for(io.reading.wait(), 5)
        # Meanwhile the main loop took the intake and the claim task added a claimed entry.
        loop.intake = ["claimed"]
        io.release.set()
        await asyncio.wait_for(reader, 5)
        return loop.intake

    assert sorted(asyncio.run(run())) == ["claimed", "read"]
