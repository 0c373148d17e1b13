"""What the scheduler process has read from Redis and not yet applied: new request entries
and aborts.

The step loop, the claim watcher and the resume at start-up all add to it; only the step loop
takes from it. The lists are private: entries are added only once a Redis read has returned
(never `list += await read()`, which would extend the list held before the await while another
task replaced it - requests were once lost that way), and `take()` swaps them out in one
synchronous call, so no task switch can fall between reading and clearing.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError, ResponseError

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.redis_io import RedisIO, StreamEntry
from pagedserve.shared.protocol import AbortRequest

logger = logging.getLogger(__name__)


class Intake:
    def __init__(self, io: RedisIO, backoff: RedisBackoff, stopping: asyncio.Event) -> None:
        self._io = io
        self._backoff = backoff
        self._stopping = stopping
        self._entries: list[StreamEntry] = []
        self._aborts: list[AbortRequest] = []

    def __len__(self) -> int:
        """Request entries waiting to be applied."""
        return len(self._entries)

    def add_entries(self, entries: list[StreamEntry]) -> None:
        self._entries.extend(entries)

    def add_abort(self, abort: AbortRequest) -> None:
        self._aborts.append(abort)

    def take(self) -> tuple[list[StreamEntry], list[AbortRequest]]:
        """Everything added so far (entries first, then aborts), leaving the intake empty."""
        entries, self._entries = self._entries, []
        aborts, self._aborts = self._aborts, []
        return entries, aborts

    async def read(self, count: int, block_ms: int | None) -> None:
        """Read up to `count` new requests (blocking up to `block_ms`; None: not at all) and
        every new abort. A Redis failure is logged and backed off, never raised."""
        if self._backoff.remaining_s > 0:
            await asyncio.sleep(min(0.1, self._backoff.remaining_s))
            return
        try:
            entries, aborts = await self._io.read_arrivals(count, block_ms)
            self.add_entries(entries)
            for abort in aborts:
                self.add_abort(abort)
        except RedisError as exc:
            if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                # Redis lost its data (restarted without persistence): recreate the group.
                logger.warning("the consumer group is gone (%s): creating it again", exc)
                self._backoff.note_data_loss()
                await self._backoff.retry("set-up", self._io.setup, self._stopping)
            else:
                await self._backoff.failed("read", exc, wait=False)
            return
        self._backoff.succeeded()
