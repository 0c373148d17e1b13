"""The scheduler process's book of requests: which gateway and stream entry each live request
came from, what to do with what is read from Redis, and where each delta goes.

It admits request entries into the `Scheduler` (or answers them: rejected, queue full, aborted
before they arrived, from a gateway found gone), remembers aborts of requests not seen yet,
routes deltas to their gateways through the outbox, and ACKs an entry when its request
finishes. Every request it admitted is in `inflight` until a finished delta passes `collect`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from pagedserve.services.scheduler.errors import QueueFullError, RequestRejectedError
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import StreamEntry
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.protocol import (
    ERROR_ENGINE,
    ERROR_INVALID_REQUEST,
    ERROR_QUEUE_FULL,
    GenerateRequest,
    StepPlan,
    TokenDelta,
)

logger = logging.getLogger(__name__)

RECENT_ABORTS = 10_000  # aborts of requests not (yet) seen here, remembered this many
GONE_GATEWAYS = 1_000  # gateways found dead, remembered this many


@dataclass(slots=True)
class Inflight:
    """What the ledger knows of a request beyond the Scheduler: where it came from."""

    stream: str  # the request stream its entry came from
    entry_id: str
    gateway_id: str
    scheduled: bool = False
    got_first_token: bool = False


def _finish_state(delta: TokenDelta) -> str:
    if delta.finish_reason == "abort":
        return "aborted"
    return "failed" if delta.finish_reason == "error" else "finished"


class Ledger:
    def __init__(self, scheduler: Scheduler, outbox: Outbox, engine_id: str) -> None:
        self.scheduler = scheduler
        self.outbox = outbox
        self.engine_id = engine_id
        self.inflight: dict[str, Inflight] = {}
        self.num_generated_tokens = 0  # total, for the throughput log
        self._recent_aborts: OrderedDict[str, str] = OrderedDict()
        # gateway id -> unix time it was found gone: its requests that arrived before then and
        # are still in the stream are aborted when read (a restarted gateway may reuse the id)
        self._gone_gateways: OrderedDict[str, float] = OrderedDict()

    # -- what Redis delivered --------------------------------------------------------------------

    def admit(self, entry: StreamEntry) -> None:
        request = entry.request
        if request is None:
            logger.error("dropping request entry %s: %s", entry.entry_id, entry.problem)
            self.outbox.ack(entry.stream, entry.entry_id)
            return
        known = self.inflight.get(request.request_id)
        if known is not None:  # delivered twice (resume + claim, re-queued after a Redis loss)
            if (known.stream, known.entry_id) != (entry.stream, entry.entry_id):
                self.outbox.ack(entry.stream, entry.entry_id)  # a second entry: nobody else will
            return
        self.inflight[request.request_id] = Inflight(
            entry.stream, entry.entry_id, request.gateway_id
        )
        reason = self._abort_reason(request)
        if reason is not None:
            aborted = TokenDelta(
                request_id=request.request_id, token_ids=[], finish_reason="abort", error=reason
            )
            self.collect([aborted])
            return
        try:
            self.scheduler.add_request(request)
        except QueueFullError as exc:
            self._reject(request, str(exc), ERROR_QUEUE_FULL)
            return
        except RequestRejectedError as exc:
            self._reject(request, str(exc), ERROR_INVALID_REQUEST)
            return
        self.outbox.set_status(request.request_id, engine_id=self.engine_id)

    def _abort_reason(self, request: GenerateRequest) -> str | None:
        reason = self._recent_aborts.pop(request.request_id, None)
        gone_at = self._gone_gateways.get(request.gateway_id)
        if gone_at is not None and request.arrival_time <= gone_at:
            return "gateway gone"
        return reason

    def _reject(self, request: GenerateRequest, message: str, code: str) -> None:
        logger.info("rejecting %s: %s", request.request_id, message)
        num_prompt = (
            len(request.prompt_token_ids) if isinstance(request.prompt_token_ids, list) else 0
        )
        delta = TokenDelta(
            request_id=request.request_id,
            token_ids=[],
            finish_reason="error",
            error=message,
            error_code=code,
            num_prompt_tokens=num_prompt,
        )
        self.collect([delta])

    def abort(self, request_ids: list[str], reason: str) -> None:
        """Abort these requests; an id not seen yet is remembered, aborted when it arrives."""
        known = [r for r in request_ids if r in self.inflight]
        for request_id in request_ids:
            if request_id not in self.inflight:
                self._recent_aborts[request_id] = reason
                if len(self._recent_aborts) > RECENT_ABORTS:
                    self._recent_aborts.popitem(last=False)
        if known:
            self.collect(self.scheduler.abort_requests(known, reason))

    # -- gateways --------------------------------------------------------------------------------

    def gateway_ids(self) -> set[str]:
        return {i.gateway_id for i in self.inflight.values() if i.gateway_id}

    def mark_gateway_gone(self, gateway_id: str) -> list[str]:
        """Remember that `gateway_id` is gone; returns its in-flight request ids (to abort)."""
        self._gone_gateways[gateway_id] = time.time()
        if len(self._gone_gateways) > GONE_GATEWAYS:
            self._gone_gateways.popitem(last=False)
        return [r for r, i in self.inflight.items() if i.gateway_id == gateway_id]

    # -- what the engine produced ----------------------------------------------------------------

    def note_scheduled(self, plan: StepPlan) -> None:
        now = time.time()
        for seq in plan.new_seqs:
            inflight = self.inflight.get(seq.seq_id)
            if inflight is None:
                continue
            if not inflight.scheduled:
                inflight.scheduled = True
                self.outbox.set_status(seq.seq_id, state="running", scheduled_at=now)
            else:
                self.outbox.set_status(seq.seq_id, state="running")
        for seq_id in plan.preempted_seq_ids:
            if seq_id in self.inflight:
                self.outbox.set_status(seq_id, state="preempted")

    def collect(self, deltas: list[TokenDelta]) -> None:
        """Route deltas to their gateways' outboxes; finished requests get ACKed."""
        now = time.time()
        for delta in deltas:
            inflight = self.inflight.get(delta.request_id)
            if inflight is None:
                continue
            self.num_generated_tokens += len(delta.token_ids)
            if inflight.gateway_id:
                self.outbox.send(inflight.gateway_id, delta)
            if delta.token_ids and not inflight.got_first_token:
                inflight.got_first_token = True
                self.outbox.set_status(delta.request_id, first_token_at=now)
            if delta.finished:
                del self.inflight[delta.request_id]
                self.outbox.ack(inflight.stream, inflight.entry_id)
                self._set_finished_status(delta, now)

    def _set_finished_status(self, delta: TokenDelta, now: float) -> None:
        self.outbox.set_status(
            delta.request_id,
            state=_finish_state(delta),
            finished_at=now,
            finish_reason=delta.finish_reason,
            num_prompt_tokens=delta.num_prompt_tokens,
            num_output_tokens=delta.num_output_tokens,
            engine_id=self.engine_id,
            error=delta.error or "",
        )

    def fail_unfinished(self, message: str) -> None:
        """Fail every unfinished request with an engine error saying `message`."""
        deltas = self.scheduler.abort_requests(list(self.inflight), "workers lost")
        logger.error("failing %d unfinished request(s): %s", len(deltas), message)
        failed = [
            replace(d, finish_reason="error", error=message, error_code=ERROR_ENGINE)
            for d in deltas
        ]
        self.collect(failed)
