"""Where every live request of a scheduler is, and the moves both halves of a step make.

A live request is in `requests` and in exactly one of `waiting` (holding no block) and
`running` (in admission order, the newest last, holding its block table in `kv`). Planning a
step (step_planner.py) admits and preempts; applying its result (result_applier.py) finishes.
Both tell the workers what changed through the ids this object keeps for the next plan.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_queue import BaseRequestQueue
from pagedserve.shared.protocol import TokenDelta

RUNNING = RequestStatus.RUNNING
MAX_FINISHED_RECORDS = 4096


@dataclass(frozen=True, slots=True)
class FinishedRecord:
    """What the scheduler keeps of a finished request: its outcome and timeline, not its
    tokens. (It had kept the whole `Request`, prompt and block hashes with it: the last 4096
    of 8000-token prompts held 1.5 GiB of the scheduler's memory.)"""

    request_id: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None

    @classmethod
    def of(cls, request: Request) -> FinishedRecord:
        return cls(
            request.request_id,
            request.finish_reason,
            request.num_prompt_tokens,
            request.num_output_tokens,
            request.num_preemptions,
            request.arrival_time,
            request.first_scheduled_time,
            request.first_token_time,
            request.finish_time,
        )


class RequestSets:
    def __init__(self, kv: KVCacheManager, waiting: BaseRequestQueue) -> None:
        self.kv = kv
        self.waiting = waiting
        self.running: list[Request] = []  # in admission order: the newest is last
        self.requests: dict[str, Request] = {}  # every live (waiting or running) request
        # the latest finished requests' outcomes and timelines
        self.finished_requests: deque[FinishedRecord] = deque(maxlen=MAX_FINISHED_RECORDS)
        self.finished_ids: list[str] = []  # for the next plan
        self.preempted_ids: list[str] = []  # for the next plan
        self.num_preemptions = 0
        self.num_finished = 0

    def add(self, request: Request) -> None:
        """Queue a new request (`QueueFullError` if the waiting queue is full)."""
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def add_running(self, request: Request) -> None:
        """A sequence born running (a forked beam, its blocks already shared)."""
        request.status = RUNNING
        self.running.append(request)
        self.requests[request.request_id] = request

    def drop(self, request: Request) -> None:
        """End a sequence that is part of a request (a beam) without finishing the request:
        its blocks go back and the workers forget it. A running one stays in `running` until
        `drop_finished_from_running`."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.kv.free(request)
        del self.requests[request.request_id]
        self.finished_ids.append(request.request_id)

    def record_finished(self, request: Request) -> None:
        """Count a finished request whose sequences were dropped (beam search)."""
        self.finished_requests.append(FinishedRecord.of(request))
        self.num_finished += 1

    def take_notices(self) -> tuple[list[str], list[str]]:
        """The ids finished and preempted since the last plan, for the next one."""
        notices = self.finished_ids, self.preempted_ids
        self.finished_ids, self.preempted_ids = [], []
        return notices

    def preempt(self, request: Request) -> None:
        """Free the request's blocks and put it back at the head of the waiting queue, to be
        recomputed from its first token. The caller has taken it out of `running`."""
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_sent_tokens = 0
        request.num_sent_blocks = 0
        request.num_draft_tokens = 0
        request.kept_sample_steps.clear()  # the workers drop its state with what they kept
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push_front(request)
        self.preempted_ids.append(request.request_id)

    def preempt_all_running(self) -> int:
        """Every running request back to the head of the waiting queue, in its order."""
        victims, self.running = self.running, []
        for request in reversed(victims):
            self.preempt(request)
        return len(victims)

    def finish(self, request: Request, reason: str, **delta_fields) -> TokenDelta:
        """Free the request and forget it; returns its last delta. A running request stays in
        `running` until `drop_finished_from_running` (one pass for a whole step)."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = time.time()
        self.kv.free(request)
        del self.requests[request.request_id]
        self.finished_requests.append(FinishedRecord.of(request))
        self.finished_ids.append(request.request_id)
        self.num_finished += 1
        delta_fields.setdefault("token_ids", [])
        return TokenDelta(
            request_id=request.request_id,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_preemptions=request.num_preemptions,
            **delta_fields,
        )

    def drop_finished_from_running(self) -> None:
        if any(r.status is not RUNNING for r in self.running):
            self.running = [r for r in self.running if r.status is RUNNING]

    def check_integrity(self, max_num_seqs: int) -> None:
        """Raise AssertionError naming the first broken invariant of the sets, then of the KV
        cache beneath them. O(blocks + requests)."""
        waiting_ids = [r.request_id for r in self.waiting]
        running_ids = [r.request_id for r in self.running]
        assert len(set(waiting_ids)) == len(waiting_ids), f"duplicate waiting ids: {waiting_ids}"
        assert len(set(running_ids)) == len(running_ids), f"duplicate running ids: {running_ids}"
        both = set(waiting_ids) & set(running_ids)
        assert not both, f"requests both waiting and running: {sorted(both)}"
        live = set(waiting_ids) | set(running_ids)
        assert live == set(self.requests), (
            f"live requests {sorted(self.requests)} != waiting + running {sorted(live)}"
        )
        for r in self.waiting:
            assert r.status is RequestStatus.WAITING, f"{r.request_id} waiting with {r.status}"
            assert self.kv.num_blocks_held(r.request_id) == 0, (
                f"waiting request {r.request_id} holds blocks"
            )
        for r in self.running:
            assert r.status is RUNNING, f"{r.request_id} running with {r.status}"
        assert len(self.running) <= max_num_seqs, (
            f"{len(self.running)} running > max_num_seqs {max_num_seqs}"
        )
        self.kv.check_integrity(self.running)
