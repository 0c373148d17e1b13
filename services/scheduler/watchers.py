"""The scheduler process's background watchers: both look at Redis on a timer and feed the
intake, which the step loop applies between steps (so neither touches the Scheduler).

- `claim_abandoned_forever`: takes over the un-ACKed requests of dead engines (their status
  expired); they are run again from their prompts, and the gateway drops the replayed tokens.
- `watch_gateways_forever`: aborts the requests of a gateway whose heartbeat key expired.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from pagedserve.services.scheduler.intake import Intake
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.shared.protocol import AbortRequest

logger = logging.getLogger(__name__)

CLAIM_INTERVAL_S = 5.0  # how often to look for dead engines' requests
CLAIM_MIN_IDLE_MS = 10_000  # an entry is claimed once idle this long (and its engine is dead)


async def claim_abandoned_forever(io: RedisIO, intake: Intake, stopping: asyncio.Event) -> None:
    while True:
        await asyncio.sleep(CLAIM_INTERVAL_S)
        if stopping.is_set():
            continue
        try:
            claimed = await io.claim_abandoned(CLAIM_MIN_IDLE_MS)
        except RedisError as exc:
            logger.warning("claiming dead engines' requests failed: %s", exc)
            continue
        intake.add_entries(claimed)


async def watch_gateways_forever(
    io: RedisIO, ledger: Ledger, intake: Intake, interval_s: float
) -> None:
    # A gateway counts as gone when its heartbeat key is missing at two checks in a row:
    # right after a Redis restart every key is missing until the next heartbeat (2 s).
    suspects: set[str] = set()
    while True:
        await asyncio.sleep(interval_s)
        gateway_ids = ledger.gateway_ids()
        if not gateway_ids:
            continue
        try:
            missing = await io.missing_gateways(gateway_ids)
        except RedisError as exc:
            logger.warning("gateway heartbeat check failed: %s", exc)
            continue
        gone, suspects = missing & suspects, missing
        for gateway_id in gone:
            request_ids = ledger.mark_gateway_gone(gateway_id)
            logger.warning(
                "gateway %s is gone (heartbeat expired): aborting its %d request(s)",
                gateway_id,
                len(request_ids),
            )
            intake.add_abort(AbortRequest(request_ids, "gateway gone"))
