"""Background tasks end even when one swallows a cancellation (redis-py can, when it lands
mid-command), and what a task raised is collected."""

from __future__ import annotations

import asyncio
import gc

from pagedserve.shared.tasks import cancel_and_wait


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
