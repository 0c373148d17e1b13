"""Shutting the scheduler process down: a stop cuts a Redis backoff short."""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import ConnectionError as RedisConnectionError

from pagedserve.services.scheduler.backoff import RedisBackoff


def test_a_stop_cuts_a_redis_backoff_short() -> None:
    async def run() -> tuple[object, float, int]:
        stopping = asyncio.Event()
        backoff = RedisBackoff()
        backoff.delay_s = 2.5  # the next failure waits the 5 s cap

        async def down() -> None:
            raise RedisConnectionError("refused")

        asyncio.get_running_loop().call_later(0.2, stopping.set)
        start = time.monotonic()
        result = await backoff.retry("set-up", down, stopping)
        return result, time.monotonic() - start, backoff.num_failures

    result, elapsed_s, num_failures = asyncio.run(run())
    assert result is None and num_failures == 1
    assert elapsed_s < 4.0  # not the 5 s backoff
