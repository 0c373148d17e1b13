"""The intake is shared by the step loop and the claim watcher: an entry one of them adds
while the other awaits Redis must never be lost (a lost entry is a request that hangs
forever), and `take()` empties it in one go."""

from __future__ import annotations

import asyncio

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.intake import Intake
from pagedserve.shared.protocol import AbortRequest


class BlockingIO:
    """Stands in for RedisIO: read_arrivals waits until released, then returns its entries."""

    def __init__(self, entries: list[str]) -> None:
        self.entries = entries
        self.release = asyncio.Event()
        self.reading = asyncio.Event()

    async def read_arrivals(
        self, count: int, block_ms: int | None
    ) -> tuple[list[str], list[AbortRequest]]:
        self.reading.set()
        await self.release.wait()
        return self.entries, [AbortRequest(["x"], "test")]


def test_entries_added_while_a_read_is_pending_are_kept() -> None:
    async def run() -> tuple:
        io = BlockingIO(["read"])
        intake = Intake(io, RedisBackoff(), asyncio.Event())  # type: ignore[arg-type]
        intake.add_entries(["before"])  # type: ignore[list-item]
        reader = asyncio.create_task(intake.read(count=10, block_ms=100))
        await asyncio.wait_for(io.reading.wait(), 5)
        # Meanwhile the step loop takes the intake and the claim watcher adds an entry.
        first = intake.take()
        intake.add_entries(["claimed"])  # type: ignore[list-item]
        io.release.set()
        await asyncio.wait_for(reader, 5)
        return first, intake.take(), len(intake)

    first, second, left = asyncio.run(run())
    assert first == (["before"], [])
    entries, aborts = second
    assert sorted(entries) == ["claimed", "read"] and aborts == [AbortRequest(["x"], "test")]
    assert left == 0
