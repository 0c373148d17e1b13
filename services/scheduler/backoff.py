"""Capped exponential backoff for the scheduler process's Redis calls.

One instance is shared by every Redis call of the step loop (intake reads, outbox writes): after
a failure no call is tried again before the backoff has passed, so an outage costs one failed
call per backoff period, not one per step. `num_failures` lets the outbox tell that Redis
failed since it last wrote (see `outbox.py`: what it wrote just before may be lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

T = TypeVar("T")

MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


class RedisBackoff:
    def __init__(self, max_backoff_s: float = MAX_BACKOFF_S) -> None:
        self.max_backoff_s = max_backoff_s
        self.delay_s = 0.0  # 0: the last call succeeded
        self.num_failures = 0  # total, since start
        self._retry_at = 0.0  # monotonic

    @property
    def remaining_s(self) -> float:
        """How long until the next call may be tried (0: now)."""
        if not self.delay_s:
            return 0.0
        return max(0.0, self._retry_at - time.monotonic())

    def succeeded(self) -> None:
        self.delay_s = 0.0

    def note_data_loss(self) -> None:
        """Redis answers but has lost its data (restarted without persistence)."""
        self.num_failures += 1

    async def failed(self, what: str, exc: Exception, wait: bool = True) -> None:
        """Note a failed call (logged with the backoff); sleep the backoff if `wait`."""
        self.num_failures += 1
        self.delay_s = min(self.max_backoff_s, max(MIN_BACKOFF_S, self.delay_s * 2))
        self._retry_at = time.monotonic() + self.delay_s
        logger.warning("Redis %s failed (%s); retrying in %.1fs", what, exc, self.delay_s)
        if wait:
            await asyncio.sleep(self.delay_s)

    async def retry(
        self, what: str, call: Callable[[], Awaitable[T]], stopping: asyncio.Event
    ) -> T | None:
        """`call()`'s result, retried with backoff until it succeeds; None once `stopping`."""
        while not stopping.is_set():
            try:
                result = await call()
            except RedisError as exc:
                await self.failed(what, exc, wait=False)
                with contextlib.suppress(TimeoutError):  # a stop cuts the wait short
                    await asyncio.wait_for(stopping.wait(), self.delay_s)
                continue
            self.succeeded()
            return result
        return None
