"""Shutting the scheduler process down: background tasks end even when one swallows a
cancellation (redis-py can, when it lands mid-command), and a stop cuts a Redis backoff short."""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import ConnectionError as RedisConnectionError

from services.scheduler.backoff import RedisBackoff
from services.scheduler.step_loop import cancel_and_wait


async def swallows_one_cancel(swallowed: list[bool]) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        swallowed.append(True)  # as a client library that eats it would
    await asyncio.sleep(60)


def test_cancel_and_wait_ends_a_task_that_swallowed_a_cancellation() -> None:
    async def run() -> tuple[list[bool], bool]:
        swallowed: list[bool] = []
        task = asyncio.create_task(swallows_one_cancel(swallowed))
        plain = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait([task, plain]), 10)
        return swallowed, task.cancelled() and plain.cancelled()

    swallowed, both_cancelled = asyncio.run(run())
    assert swallowed == [True] and both_cancelled


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
