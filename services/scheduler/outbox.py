"""What the scheduler process owes Redis: token deltas for each gateway, ACKs of finished
requests, request status fields and the engine's status, written in one MULTI/EXEC per flush.

A failed write is kept, in front of whatever is collected after it, and tried again once the
shared backoff has passed: nothing is lost and nothing is written twice.

Redis may also lose what it *accepted*: restarted without persistence, it forgets the output
entries a gateway had not read yet (the "output tokens 8..8 never arrived" case). So the outbox
remembers the deltas it wrote in the last `RESEND_WINDOW_S`, and the first write after Redis
failed sends them again, ahead of the new ones. A gateway drops what it has already shown
(`services/gateway/replay_guard.py` checks each delta's position), so a resend after a mere
stall costs duplicates the gateway ignores, never a repeated token.
"""

from __future__ import annotations

import time
from collections import deque

from redis.exceptions import RedisError

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.redis_io import RedisIO, StepWrites
from pagedserve.shared.protocol import TokenDelta

# A gateway reads its output stream continuously: an entry it has not read this long after it
# was written belongs to a gateway that is gone (its requests get aborted anyway).
RESEND_WINDOW_S = 15.0


class Outbox:
    def __init__(self, io: RedisIO, backoff: RedisBackoff) -> None:
        self._io = io
        self._backoff = backoff
        self._pending = StepWrites.empty()
        # (monotonic write time, gateway id, deltas) of recent successful writes, oldest first
        self._written: deque[tuple[float, str, list[TokenDelta]]] = deque()
        self._failures_seen = backoff.num_failures

    # -- collecting ------------------------------------------------------------------------------

    def send(self, gateway_id: str, delta: TokenDelta) -> None:
        self._pending.outputs.setdefault(gateway_id, []).append(delta)

    def ack(self, stream: str, entry_id: str) -> None:
        self._pending.ack(stream, entry_id)

    def set_status(self, request_id: str, **fields: object) -> None:
        self._pending.set_status(request_id, **fields)

    def set_engine_fields(self, fields: dict[str, str]) -> None:
        self._pending.engine_fields = fields

    def __bool__(self) -> bool:
        return bool(self._pending)

    # -- writing ---------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write what was collected, unless the backoff says to wait. Never raises RedisError:
        a failure is logged, backed off, and the writes are kept for the next flush."""
        if self._backoff.remaining_s > 0:
            return
        resend = self._backoff.num_failures != self._failures_seen
        if not self._pending and not resend:
            return
        writes, self._pending = self._pending, StepWrites.empty()
        failures = self._backoff.num_failures
        to_write = self._with_resent(writes) if resend else writes
        try:
            await self._io.write_step(to_write)
        except RedisError as exc:
            self._merge_back(writes)
            await self._backoff.failed("write", exc, wait=False)
            return
        self._backoff.succeeded()
        self._failures_seen = failures
        self._remember(writes)

    def _with_resent(self, writes: StepWrites) -> StepWrites:
        """`writes` with the recently written deltas in front of its own."""
        outputs: dict[str, list[TokenDelta]] = {}
        for _, gateway_id, deltas in self._written:
            outputs.setdefault(gateway_id, []).extend(deltas)
        for gateway_id, deltas in writes.outputs.items():
            outputs.setdefault(gateway_id, []).extend(deltas)
        return StepWrites(outputs, writes.acked, writes.statuses, writes.engine_fields)

    def _remember(self, writes: StepWrites) -> None:
        now = time.monotonic()
        for gateway_id, deltas in writes.outputs.items():
            self._written.append((now, gateway_id, deltas))
        while self._written and now - self._written[0][0] > RESEND_WINDOW_S:
            self._written.popleft()

    def _merge_back(self, failed: StepWrites) -> None:
        """Put failed writes back in front of whatever was collected since."""
        newer, self._pending = self._pending, failed
        for gateway_id, deltas in newer.outputs.items():
            failed.outputs.setdefault(gateway_id, []).extend(deltas)
        for stream, entry_ids in newer.acked.items():
            failed.acked.setdefault(stream, []).extend(entry_ids)
        for request_id, fields in newer.statuses.items():
            failed.set_status(request_id, **fields)
        if newer.engine_fields is not None:
            failed.engine_fields = newer.engine_fields
