"""Background tasks end even when one swallows a cancellation (redis-py can, when it lands
mid-command), what a task raised is collected, and one that dies is logged at once."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from pagedserve.shared.tasks import cancel_and_wait, start_background


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


def test_cancel_and_wait_collects_what_a_finished_task_raised() -> None:
    reported: list[str] = []

    async def fails() -> None:
        raise ValueError("boom")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait([task]), 10)
        del task
        gc.collect()  # an unretrieved exception is reported when its task is collected

    asyncio.run(run())
    assert reported == []


def test_a_background_task_that_dies_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    async def dies() -> None:
        raise RuntimeError("not a RedisError")

    async def run() -> list[str]:
        died = start_background(dies(), "output-reader")
        stopped = start_background(asyncio.sleep(60), "heartbeat")
        await asyncio.wait({died})
        await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
        logged = [r.getMessage() for r in caplog.records]
        await cancel_and_wait([died, stopped])
        return logged

    with caplog.at_level(logging.ERROR):
        logged_before_shutdown = asyncio.run(run())
    assert logged_before_shutdown == ["background task output-reader died"]
    record = caplog.records[0]
    assert record.exc_info is not None and "not a RedisError" in str(record.exc_info[1])
    assert len(caplog.records) == 1  # the cancelled one is not reported
