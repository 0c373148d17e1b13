"""What the scheduler process does when it loses a worker rank (`worker_link.py` says when):
the workers' sequence state is gone, so every running request is preempted, to be recomputed
from its tokens; the link starts a new epoch and waits for every rank's hello. If none comes
back within the recovery timeout, every unfinished request is failed with an engine error
(and the engine keeps waiting: requests that arrive later are served once workers return).
"""

from __future__ import annotations

import asyncio
import logging
import time

from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.worker_link import WorkerLink

logger = logging.getLogger(__name__)


async def recover_workers(
    link: WorkerLink,
    ledger: Ledger,
    outbox: Outbox,
    recovery_timeout_s: float,
    stopping: asyncio.Event,
) -> bool:
    """Wait until every rank is back in a new epoch: True, or False once `stopping`."""
    num_preempted = ledger.scheduler.preempt_all()
    reason = link.lost_reason
    logger.error(
        "workers lost (%s): %d running request(s) preempted, to be recomputed",
        reason,
        num_preempted,
    )
    link.new_epoch()
    await outbox.flush()
    deadline: float | None = time.monotonic() + recovery_timeout_s
    while not await link.wait_ready(1.0):
        if stopping.is_set():
            return False
        if deadline is not None and time.monotonic() > deadline:
            ledger.fail_unfinished(
                f"the engine lost its workers ({reason}) and none came back within "
                f"{recovery_timeout_s:g}s"
            )
            await outbox.flush()
            deadline = None
    return True
