"""The engines' status records as last read from Redis, refreshed in the background.

`/health` and `/metrics` answer from this view and never wait on Redis: a load balancer's
probe must get its answer fast even while Redis is stalled or the box is loaded. A read that
has been in flight longer than `STALL_AFTER_S` means Redis is not answering: then the view
reports that, as it does a failed read, until a read succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pagedserve.shared.status import EngineStatus

logger = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 0.25
STALL_AFTER_S = 0.5  # a read in flight this long: Redis is stalled (answers stay under 1 s)
FIRST_READ_WAIT_S = 0.5  # a probe before the first read completes waits this long for it


@dataclass(slots=True)
class StatusSnapshot:
    statuses: list[EngineStatus]
    process_restarts: dict[str, int] = field(default_factory=dict)


class EngineStatusView:
    """One background reader per gateway; `current()` costs no I/O. It is given the two
    reads it makes (each raises RedisError when Redis does not answer)."""

    def __init__(
        self,
        read_statuses: Callable[[], Awaitable[list[EngineStatus]]],
        read_process_restarts: Callable[[], Awaitable[dict[str, int]]],
    ) -> None:
        self._read_statuses = read_statuses
        self._read_process_restarts = read_process_restarts
        self._snapshot: StatusSnapshot | None = None
        self._error: str | None = None
        self._reading_since: float | None = None  # monotonic start of the read in flight
        self._first_read = asyncio.Event()

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_INTERVAL_S)

    async def refresh(self) -> None:
        self._reading_since = time.monotonic()
        try:
            statuses = await self._read_statuses()
            restarts = await self._read_process_restarts()
            self._snapshot, self._error = StatusSnapshot(statuses, restarts), None
        except RedisError as exc:
            self._error = str(exc) or type(exc).__name__
            logger.debug("engine status read failed: %s", self._error)
        except Exception as exc:  # a bad record: report it, and keep the view alive
            self._error = f"unreadable engine status: {exc}"
            logger.exception("engine status read failed")
        finally:
            self._reading_since = None
            self._first_read.set()

    async def current(self) -> StatusSnapshot:
        """The latest good read, or a RedisError saying why there is none: the last read
        failed, or the one in flight has waited more than `STALL_AFTER_S`."""
        if not self._first_read.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first_read.wait(), FIRST_READ_WAIT_S)
        reading_since = self._reading_since
        if reading_since is not None and time.monotonic() - reading_since > STALL_AFTER_S:
            waited = time.monotonic() - reading_since
            raise RedisTimeoutError(f"no answer for {waited:.1f}s")
        if self._error is not None:
            raise RedisError(self._error)
        if self._snapshot is None:
            raise RedisTimeoutError(f"no answer within {FIRST_READ_WAIT_S:g}s of starting")
        return self._snapshot
