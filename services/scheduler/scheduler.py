"""The continuous-batching scheduler: which sequences run each step, and what the workers are
told. Four verbs as in vLLM v1: `add_request`, `schedule`, `update_from_output`,
`abort_requests`; plus `preempt_all` for a worker restart.

Each step runs the running sequences first (one decode token each, or the next chunk of a
partially prefilled prompt), then admits waiting ones (prefix-cache hits first), within
`max_num_seqs` and `max_num_batched_tokens`. A running sequence that needs a block when none is
free preempts the newest running sequence (itself, if it is the newest; under the priority
policy the lowest-priority one, even one already planned this step, which is then taken out of
the plan): its blocks are freed and it goes back to the head of the waiting queue, to be
recomputed later. A plan is never
sent without every block it needs already allocated.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable

from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.services.scheduler.finish_rules import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    check_stop,
)
from pagedserve.services.scheduler.integrity_checker import check_integrity
from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_queue import make_request_queue
from pagedserve.services.scheduler.request_validator import check_fits, validate_request
from pagedserve.services.scheduler.speculation import draft_tokens
from pagedserve.services.scheduler.stats import SchedulerStats
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.iteration_histogram import IterationHistogram
from pagedserve.shared.protocol import (
    ERROR_ENGINE,
    ERROR_INVALID_REQUEST,
    CachedSequence,
    GenerateRequest,
    NewSequence,
    StepPlan,
    StepResult,
    TokenDelta,
)

logger = logging.getLogger(__name__)

RUNNING = RequestStatus.RUNNING


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, vocab_size: int = 0
    ) -> None:
        """`vocab_size` > 0: prompt and stop token ids must be below it."""
        if cache_config.num_blocks is None:
            raise ValueError("cache_config.num_blocks must be set (the workers report it)")
        if cache_config.block_size is None:
            raise ValueError("cache_config.block_size must be set (the workers report it)")
        if scheduler_config.max_num_batched_tokens is None:
            raise ValueError(
                "scheduler_config.max_num_batched_tokens must be set (the workers report it)"
            )
        self.config = scheduler_config
        self.vocab_size = vocab_size
        self.block_size = cache_config.block_size
        self.num_blocks = cache_config.num_blocks
        self.kv = KVCacheManager(
            cache_config.num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            cache_config.sliding_window,
        )
        self.waiting = make_request_queue(scheduler_config.policy, scheduler_config.max_waiting)
        self.running: list[Request] = []  # in admission order: the newest is last
        self.requests: dict[str, Request] = {}  # every live (waiting or running) request
        self.finished_requests: deque[Request] = deque(maxlen=4096)  # timelines, for metrics
        self._finished_ids: list[str] = []  # for the next plan
        self._preempted_ids: list[str] = []  # for the next plan
        self._next_step_id = 0
        self._next_arrival_index = 0
        self._num_preemptions = 0
        self._num_finished = 0
        self._num_aborted = 0
        self._num_steps = 0
        # speculative decoding, as vLLM counts it: sequence-steps with drafts, drafts checked,
        # drafts accepted (a draft of a request that left before its result is not counted)
        self._num_drafts = 0
        self._num_draft_tokens = 0
        self._num_accepted_tokens = 0
        self._prefix_cache_queries = 0
        self._prefix_cache_hits = 0
        self.iteration_tokens = IterationHistogram()  # tokens per step, for metrics

    # -- requests in and out -------------------------------------------------------------------

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request. Raises `RequestRejectedError` if it can never run here, or
        `QueueFullError` (retryable) if the waiting queue is at `max_waiting`."""
        self._validate(request)
        state = Request.from_generate(request, self._next_arrival_index, time.time())
        self.waiting.add_request(state)
        self._next_arrival_index += 1
        self.requests[state.request_id] = state

    def abort_requests(self, request_ids: Iterable[str], reason: str = "abort") -> list[TokenDelta]:
        """Finish the given requests now (unknown ids are ignored), freeing their blocks."""
        deltas = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status is RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            logger.debug("abort %s: %s", request_id, reason)
            self._num_aborted += 1
            deltas.append(self._finish(request, FINISH_ABORT))
        return deltas

    def preempt_all(self) -> int:
        """The workers lost their state: every running sequence goes back to the head of the
        waiting queue, in its order, to be sent in full and recomputed. Returns how many."""
        victims, self.running = self.running, []
        for request in reversed(victims):
            self._preempt(request)
        # The workers' KV is gone with their state, so no cached block may be hit any more.
        self.kv.reset_prefix_cache()
        return len(victims)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash: later requests find no prefix of earlier ones, as on
        a fresh server (benchmarks that rerun a workload; vLLM's `LLM.reset_prefix_cache()`).
        Refused while a request is unfinished: blocks that running requests share must stay
        cached (an invariant `check_integrity` asserts), and a reset belongs between runs."""
        if self.requests:
            raise ValueError(
                "cannot reset the prefix cache while requests are unfinished "
                f"({len(self.running)} running, {len(self.waiting)} waiting): "
                "finish or abort them first"
            )
        self.kv.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    # -- one step --------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        step_id = self._next_step_id
        self._next_step_id += 1
        num_preempted_before = self._num_preemptions
        token_budget = self.config.max_num_batched_tokens
        cached_seqs, token_budget = self._schedule_running(step_id, token_budget)
        new_seqs: list[NewSequence] = []
        # Admitting while preempting would only thrash: the freed blocks go to the running.
        if self._num_preemptions == num_preempted_before:
            new_seqs = self._schedule_waiting(step_id, token_budget)
        new_ids = {s.seq_id for s in new_seqs}
        plan = StepPlan(
            step_id=step_id,
            new_seqs=new_seqs,
            cached_seqs=cached_seqs,
            finished_seq_ids=self._finished_ids,
            # A NewSequence replaces whatever a worker holds under its id.
            preempted_seq_ids=[i for i in self._preempted_ids if i not in new_ids],
        )
        self._finished_ids, self._preempted_ids = [], []
        return plan

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[TokenDelta]:
        """Apply what the workers sampled for `plan`; returns one delta per sequence that got
        a token or finished. Sequences aborted or preempted since the plan are skipped."""
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} given for plan {plan.step_id}")
        self._num_steps += 1
        self.iteration_tokens.observe(plan.num_scheduled_tokens)
        scheduled = self._live_scheduled(plan)
        if result.error is not None:
            deltas = [
                self._finish(r, FINISH_ERROR, error=result.error, error_code=ERROR_ENGINE)
                for r in scheduled
            ]
            self._drop_finished_from_running()
            return deltas
        for request in scheduled:
            # Drafts count as computed only once accepted (`_append`): a rejected draft's KV
            # is overwritten later, and a block is hashed only over tokens the request has.
            request.num_computed_tokens -= request.num_draft_tokens
            self.kv.cache_blocks(request)
        deltas = self._apply_samples(plan.step_id, result)
        self._rerun_deferred(plan.step_id, result.deferred_seq_ids)
        deltas += self._fail_unsampled(scheduled, result.seq_errors)
        self._drop_finished_from_running()
        return deltas

    # -- scheduling helpers -------------------------------------------------------------------

    def _may_speculate(self) -> bool:
        """Drafts only in a pure decode step of few enough sequences: while a prompt waits or
        is part-way through its prefill, drafts would take its share of the step's token
        budget and arithmetic, and delay its first token."""
        return (
            0 < len(self.running) <= self.config.speculative_max_num_seqs
            and len(self.waiting) == 0
            and all(len(r.all_token_ids) - r.num_computed_tokens <= 1 for r in self.running)
        )

    def _schedule_running(self, step_id: int, token_budget: int) -> tuple[list, int]:
        planned: dict[str, CachedSequence] = {}  # in running order
        num_done = 0  # running[:num_done] are dealt with this step
        speculate = self._may_speculate()
        while num_done < len(self.running) and token_budget > 0:
            request = self.running[num_done]
            num_new = min(len(request.all_token_ids) - request.num_computed_tokens, token_budget)
            drafts = self._drafts(request, token_budget) if speculate and num_new == 1 else []
            num_new += len(drafts)
            if num_new > 0:  # else its sample is still in flight
                for victim, index in self._allocate_or_preempt(request, num_new):
                    num_done -= index < num_done
                    unplanned = planned.pop(victim.request_id, None)
                    if unplanned is not None:  # preempted after it was planned this step
                        token_budget += unplanned.num_scheduled_tokens
                if request.status is not RUNNING:
                    continue  # it preempted itself; running[num_done] is now the next one
                token_budget -= num_new
                planned[request.request_id] = self._cached_seq(request, num_new, step_id, drafts)
            num_done += 1
        return list(planned.values()), token_budget

    def _drafts(self, request: Request, token_budget: int) -> list[int]:
        """Speculative tokens for a request in decode, within the step's token budget."""
        room = min(self.config.num_speculative_tokens, token_budget - 1)
        return draft_tokens(request, room, self.config.max_model_len)

    def _allocate_or_preempt(self, request: Request, num_new: int) -> list[tuple[Request, int]]:
        """Allocate `request`'s slots, preempting victims until they fit; returns each victim
        with its index in `running` before it left (the request itself last, if it went)."""
        victims = []
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self._pick_victim()
            index = self.running.index(victim)
            del self.running[index]
            self._preempt(victim)
            victims.append((victim, index))
            if victim is request:
                break
        return victims

    def _pick_victim(self) -> Request:
        """fcfs: the newest running request. priority: the lowest priority (largest value),
        newest among equals, among all running ones - planned this step or not (vLLM)."""
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_index))
        return self.running[-1]

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_sent_tokens = 0
        request.num_sent_blocks = 0
        request.num_draft_tokens = 0
        request.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.push_front(request)
        self._preempted_ids.append(request.request_id)

    def _schedule_waiting(self, step_id: int, token_budget: int) -> list[NewSequence]:
        new_seqs: list[NewSequence] = []
        while self.waiting and token_budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit
            if num_new > token_budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = token_budget
            if self.kv.allocate_slots(request, num_new, hit_blocks) is None:
                break  # head-of-line: later requests do not overtake it
            self.waiting.pop()
            self._admit(request, num_hit)
            token_budget -= num_new
            new_seqs.append(self._new_seq(request, num_new, step_id))
        return new_seqs

    def _admit(self, request: Request, num_hit: int) -> None:
        request.status = RUNNING
        request.num_computed_tokens = num_hit
        self._prefix_cache_queries += request.num_tokens
        self._prefix_cache_hits += num_hit
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.time()
        self.running.append(request)

    def _new_seq(self, request: Request, num_new: int, step_id: int) -> NewSequence:
        block_ids = self.kv.get_block_ids(request.request_id)
        seq = NewSequence(
            seq_id=request.request_id,
            token_ids=list(request.all_token_ids),
            num_prompt_tokens=request.num_prompt_tokens,
            num_computed_tokens=request.num_computed_tokens,
            num_scheduled_tokens=num_new,
            block_ids=block_ids,
            sampling=request.sampling,
        )
        self._mark_sent(request, num_new, len(block_ids), step_id)
        return seq

    def _cached_seq(
        self, request: Request, num_new: int, step_id: int, drafts: list[int]
    ) -> CachedSequence:
        num_blocks = self.kv.num_blocks_held(request.request_id)
        new_block_ids = (
            self.kv.get_block_ids(request.request_id, start=request.num_sent_blocks)
            if request.num_sent_blocks < num_blocks
            else []
        )
        seq = CachedSequence(
            seq_id=request.request_id,
            new_token_ids=request.all_token_ids[request.num_sent_tokens :],
            new_block_ids=new_block_ids,
            num_computed_tokens=request.num_computed_tokens,
            num_scheduled_tokens=num_new,
            draft_token_ids=drafts,
        )
        self._mark_sent(request, num_new, num_blocks, step_id)
        request.num_draft_tokens = len(drafts)
        return seq

    @staticmethod
    def _mark_sent(request: Request, num_new: int, num_blocks: int, step_id: int) -> None:
        request.num_sent_tokens = len(request.all_token_ids)
        request.num_sent_blocks = num_blocks
        request.num_computed_tokens += num_new
        request.scheduled_step_id = step_id
        request.num_draft_tokens = 0

    # -- output helpers ----------------------------------------------------------------------

    def _live_scheduled(self, plan: StepPlan) -> list[Request]:
        live = []
        for seq in (*plan.new_seqs, *plan.cached_seqs):
            request = self.requests.get(seq.seq_id)
            if (
                request is not None
                and request.status is RUNNING
                and request.scheduled_step_id == plan.step_id
            ):
                live.append(request)
        return live

    def _apply_samples(self, step_id: int, result: StepResult) -> list[TokenDelta]:
        deltas = []
        now = time.time()
        for i, (seq_id, token_id) in enumerate(zip(result.seq_ids, result.token_ids, strict=True)):
            request = self.requests.get(seq_id)
            if request is None or request.status is not RUNNING:
                continue  # aborted or preempted since the plan
            if request.scheduled_step_id != step_id or request.num_computed_tokens != len(
                request.all_token_ids
            ):
                logger.warning("step %d sampled %s, which it did not reach", step_id, seq_id)
                continue
            prompt_logprobs = result.prompt_logprobs[i] if result.prompt_logprobs else None
            if request.sampling.max_tokens == 0:  # prompt only: done after the prefill
                deltas.append(self._finish(request, FINISH_LENGTH, prompt_logprobs=prompt_logprobs))
                continue
            more = result.more_token_ids[i] if result.more_token_ids else []
            self._count_drafts(request.num_draft_tokens, len(more))
            if request.first_token_time is None:
                request.first_token_time = now
            delta = self._append(request, [token_id, *more[: request.num_draft_tokens]], i, result)
            if prompt_logprobs is not None:
                delta = dataclasses.replace(delta, prompt_logprobs=prompt_logprobs)
            deltas.append(delta)
        return deltas

    def _count_drafts(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self._num_drafts += 1
            self._num_draft_tokens += num_drafts
            self._num_accepted_tokens += min(num_accepted, num_drafts)

    def _append(
        self, request: Request, tokens: list[int], index: int, result: StepResult
    ) -> TokenDelta:
        """Append the step's tokens (one, or accepted drafts then one) until one finishes the
        request; returns the delta. Only a request without logprobs gets several."""
        shown: list[int] = []
        for j, token_id in enumerate(tokens):
            if j:  # the token before this one was a draft, and its KV was computed with it
                request.num_computed_tokens += 1
            request.all_token_ids.append(token_id)
            reason, is_stop_token = check_stop(request, token_id, self.config.max_model_len)
            if not is_stop_token:
                shown.append(token_id)
            if reason is not None:
                return self._finish_with(request, reason, shown, is_stop_token, index, result)
        return self._token_delta(request, shown, index, result)

    def _finish_with(
        self,
        request: Request,
        reason: str,
        shown: list[int],
        is_stop_token: bool,
        index: int,
        result: StepResult,
    ) -> TokenDelta:
        logprobs, top_logprobs = self._logprobs(request, shown, index, result)
        return self._finish(
            request,
            reason,
            token_ids=shown,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            stop_token_id=request.all_token_ids[-1] if is_stop_token else None,
        )

    @staticmethod
    def _logprobs(
        request: Request, shown: list[int], index: int, result: StepResult
    ) -> tuple[list | None, list | None]:
        """The step's logprobs for the shown token (a request with logprobs gets one)."""
        if request.sampling.logprobs is None or result.logprobs is None:
            return None, None
        logprobs = [result.logprobs[index]][: len(shown)]
        top = None if result.top_logprobs is None else [result.top_logprobs[index]][: len(shown)]
        return logprobs, top

    def _token_delta(
        self, request: Request, shown: list[int], index: int, result: StepResult
    ) -> TokenDelta:
        logprobs, top_logprobs = self._logprobs(request, shown, index, result)
        num_prompt = request.num_prompt_tokens
        return TokenDelta(
            request_id=request.request_id,
            token_ids=shown,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            num_prompt_tokens=num_prompt,
            num_output_tokens=len(request.all_token_ids) - num_prompt,
            num_cached_tokens=max(request.num_cached_tokens, 0),
        )

    def _rerun_deferred(self, step_id: int, seq_ids: list[str]) -> None:
        """Sequences not sampled yet (their grammar is compiling) rerun their last token."""
        for request in filter(None, map(self.requests.get, seq_ids)):
            if request.scheduled_step_id == step_id and request.num_computed_tokens == len(
                request.all_token_ids
            ):
                request.num_computed_tokens -= 1

    def _fail_unsampled(self, scheduled: list[Request], errors: dict[str, str]) -> list[TokenDelta]:
        """A sequence whose step reached its last token must get one; without it, it would
        wait forever. Fail it loudly instead (with the worker's reason when it gave one: a
        grammar that does not compile is the request's fault)."""
        return [
            self._finish(
                r,
                FINISH_ERROR,
                error=errors.get(r.request_id)
                or f"the worker returned no token for {r.request_id} in step {r.scheduled_step_id}",
                error_code=ERROR_INVALID_REQUEST if r.request_id in errors else ERROR_ENGINE,
            )
            for r in scheduled
            if r.status is RUNNING and r.num_computed_tokens == r.num_tokens
        ]

    def _finish(self, request: Request, reason: str, **delta_fields) -> TokenDelta:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = time.time()
        self.kv.free(request)
        del self.requests[request.request_id]
        self.finished_requests.append(request)
        self._finished_ids.append(request.request_id)
        self._num_finished += 1
        delta_fields.setdefault("token_ids", [])
        return TokenDelta(
            request_id=request.request_id,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            **delta_fields,
        )

    def _drop_finished_from_running(self) -> None:
        if any(r.status is not RUNNING for r in self.running):
            self.running = [r for r in self.running if r.status is RUNNING]

    # -- validation, stats, invariants -----------------------------------------------------------

    def _validate(self, request: GenerateRequest) -> None:
        if request.request_id in self.requests:
            raise RequestRejectedError(f"request id {request.request_id!r} is already in use")
        validate_request(request, self.vocab_size)
        check_fits(request, self.config.max_model_len, self.block_size, self.num_blocks)

    def stats(self) -> SchedulerStats:
        num_free = self.kv.num_free_blocks
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_free_blocks=num_free,
            num_total_blocks=self.num_blocks,
            kv_usage=1.0 - num_free / self.num_blocks,
            prefix_cache_queries=self._prefix_cache_queries,
            prefix_cache_hits=self._prefix_cache_hits,
            num_preemptions=self._num_preemptions,
            num_finished=self._num_finished,
            num_aborted=self._num_aborted,
            num_steps=self._num_steps,
            spec_num_drafts=self._num_drafts,
            spec_num_draft_tokens=self._num_draft_tokens,
            spec_num_accepted_tokens=self._num_accepted_tokens,
        )

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant. O(blocks + requests)."""
        check_integrity(self)
