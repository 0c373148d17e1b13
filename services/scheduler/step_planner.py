"""What a step runs: the plan the workers are sent.

Each step runs the running sequences first (one decode token each, plus drafts in a pure
decode step, or the next chunk of a partially prefilled prompt), then admits waiting ones
(prefix-cache hits first), within `max_num_seqs` and `max_num_batched_tokens`. A running
sequence that needs a block when none is free preempts the newest running sequence (itself,
if it is the newest; under the priority policy the lowest-priority one, even one already
planned this step, which is then taken out of the plan): its blocks are freed and it goes back
to the head of the waiting queue, to be recomputed later. A plan is never sent without every
block it needs already allocated. The workers hear of a sequence in full once
(`NewSequence`), then only of what is new (`CachedSequence`); a forked beam, or one whose
shared block was just copied, in full again. A beam search is preempted whole, and its
beams take no drafts (beam_groups.py).

With async scheduling (`SchedulerConfig.async_scheduling`) the worker keeps what it samples
for every plain sequence (`keep_sample`: no beam, no grammar, no drafts this step), and a plan
made while the previous step still computes (`schedule(plan_ahead=True)`) runs each such
sequence on the token that step is sampling: one scheduled token, nothing sent, its position
the one after the last known token. A sequence that finishes on that sample has computed one
token for nothing; its result is dropped (vLLM's async scheduling does the same).
"""

from __future__ import annotations

import time

from pagedserve.services.scheduler.beam_groups import BeamGroups
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_sets import RequestSets
from pagedserve.services.scheduler.speculation import draft_tokens
from pagedserve.shared.config import SchedulerConfig
from pagedserve.shared.protocol import CachedSequence, NewSequence, StepPlan

RUNNING = RequestStatus.RUNNING


class StepPlanner:
    def __init__(
        self, config: SchedulerConfig, sets: RequestSets, beams: BeamGroups, vocab_size: int = 0
    ) -> None:
        self.config = config
        self.vocab_size = vocab_size  # > 0: drafts may count on, below it (ngram_proposer.py)
        self.sets = sets
        self.beams = beams
        self.kv = sets.kv
        self._next_step_id = 0
        self.num_prefix_cache_queries = 0  # prompt tokens looked up at admission
        self.num_prefix_cache_hits = 0  # of those, found in the prefix cache

    def schedule(self, plan_ahead: bool = False) -> StepPlan:
        """`plan_ahead`: the previous plan's result is not in yet (see the module docstring)."""
        step_id = self._next_step_id
        self._next_step_id += 1
        num_preempted_before = self.sets.num_preemptions
        token_budget = self.config.max_num_batched_tokens
        planned, token_budget = self._schedule_running(step_id, token_budget, plan_ahead)
        new_seqs = [s for s in planned if isinstance(s, NewSequence)]
        cached_seqs = [s for s in planned if isinstance(s, CachedSequence)]
        # Admitting while preempting would only thrash: the freed blocks go to the running.
        if self.sets.num_preemptions == num_preempted_before:
            new_seqs += self._schedule_waiting(step_id, token_budget)
        new_ids = {s.seq_id for s in new_seqs}
        finished_ids, preempted_ids = self.sets.take_notices()
        return StepPlan(
            step_id=step_id,
            new_seqs=new_seqs,
            cached_seqs=cached_seqs,
            finished_seq_ids=finished_ids,
            # A NewSequence replaces whatever a worker holds under its id.
            preempted_seq_ids=[i for i in preempted_ids if i not in new_ids],
            block_copies=self.kv.take_block_copies(),
        )

    # -- the running ---------------------------------------------------------------------------

    def _may_speculate(self) -> bool:
        """Drafts only in a pure decode step of few enough sequences: while a prompt waits or
        is part-way through its prefill, drafts would take its share of the step's token
        budget and arithmetic, and delay its first token. Nor right after a request finished:
        a client that got its answer often sends its next request at once, which then waits
        for this step (bf16, 16 in flight, 2 alternated rounds: TTFT p50 136-138 against
        174-175 ms, output tok/s 1.02-1.07x)."""
        running = self.sets.running
        return (
            0 < len(running) <= self.config.speculative_max_num_seqs
            and len(self.sets.waiting) == 0
            and not self.sets.finished_ids
            and all(len(r.all_token_ids) - r.num_computed_tokens <= 1 for r in running)
        )

    def can_plan_ahead(self) -> bool:
        """Whether a plan made now, before the last plan's result, loses nothing: every running
        sequence whose sample is in flight has it kept by the worker (so the plan can run it on
        that sample), or it would sit the step out and fall a step behind; and the step is no
        pure decode step that could take drafts (they need the last token known: where they
        apply, they save more than planning ahead does)."""
        if not self.config.async_scheduling:
            return False
        if self.config.num_speculative_tokens and self._may_speculate():
            return False
        return all(
            r.kept_sample_steps or r.num_computed_tokens < r.num_tokens for r in self.sets.running
        )

    def _runs_on_sample_in_flight(self, request: Request) -> bool:
        """Whether a plan made ahead may run `request` on the token its last plan samples:
        that sample is kept, it is the only one in flight, and neither it nor the one after it
        would reach the request's length limits (which end it for sure)."""
        if len(request.kept_sample_steps) != 1 or request.num_computed_tokens != request.num_tokens:
            return False
        max_tokens = request.sampling.max_tokens
        if max_tokens is not None and request.num_output_tokens + 2 > max_tokens:
            return False
        return request.num_tokens + 2 <= self.config.max_model_len

    def _schedule_running(
        self, step_id: int, token_budget: int, plan_ahead: bool = False
    ) -> tuple[list, int]:
        running = self.sets.running  # only changed in place while planning
        planned: dict[str, CachedSequence | NewSequence] = {}  # in running order
        num_done = 0  # running[:num_done] are dealt with this step
        speculate = self._may_speculate()
        while num_done < len(running) and token_budget > 0:
            request = running[num_done]
            num_new = min(len(request.all_token_ids) - request.num_computed_tokens, token_budget)
            on_sample_in_flight = (
                plan_ahead and num_new == 0 and self._runs_on_sample_in_flight(request)
            )
            if on_sample_in_flight:
                num_new = 1  # the token being sampled now (the worker appends it)
            drafts = (
                self._drafts(request, token_budget)
                if speculate
                and num_new == 1
                and request.beam_group_id is None
                and not on_sample_in_flight  # drafts follow the last known token
                else []
            )
            if drafts and not self._allocate(request, num_new + len(drafts)):
                drafts = []  # they would take a block from someone else: none this step
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
                planned[request.request_id] = (
                    self._new_seq(request, num_new, step_id)
                    if request.needs_full_send
                    else self._cached_seq(request, num_new, step_id, drafts)
                )
            num_done += 1
        return list(planned.values()), token_budget

    def _drafts(self, request: Request, token_budget: int) -> list[int]:
        """Speculative tokens for a request in decode, within the step's token budget."""
        room = min(self.config.num_speculative_tokens, token_budget - 1)
        return draft_tokens(request, room, self.config.max_model_len, self.vocab_size)

    def _allocate_or_preempt(self, request: Request, num_new: int) -> list[tuple[Request, int]]:
        """Allocate `request`'s slots, preempting victims until they fit; returns each victim
        with its index in `running` before it left (the request itself last, if it went)."""
        victims: list[tuple[Request, int]] = []
        while not self._allocate(request, num_new):
            for victim in self.beams.members(self._pick_victim()):
                victims.append((victim, self._preempt(victim)))
            if any(victim is request for victim, _ in victims):
                break
        return victims

    def _allocate(self, request: Request, num_new: int) -> bool:
        """Copy a shared block about to be written, then allocate; False if out of blocks."""
        copied = self.kv.copy_on_write(request)
        if copied:
            request.needs_full_send = True  # its table changed in place
        return copied is not None and self.kv.allocate_slots(request, num_new) is not None

    def _preempt(self, request: Request) -> int:
        """Preempt a running request; returns its index in `running` before it left."""
        running = self.sets.running
        index = running.index(request)
        del running[index]
        self.sets.preempt(request)
        self.beams.forget_results(request)
        return index

    def _pick_victim(self) -> Request:
        """fcfs: the newest running request. priority: the lowest priority (largest value),
        newest among equals, among all running ones - planned this step or not (vLLM)."""
        if self.config.policy == "priority":
            return max(self.sets.running, key=lambda r: (r.priority, r.arrival_index))
        return self.sets.running[-1]

    # -- the waiting ---------------------------------------------------------------------------

    def _schedule_waiting(self, step_id: int, token_budget: int) -> list[NewSequence]:
        waiting, running = self.sets.waiting, self.sets.running
        new_seqs: list[NewSequence] = []
        while waiting and token_budget > 0:
            request = waiting.peek()
            num_seqs = len(running) + self.beams.num_reserved_seqs()
            if num_seqs + self.beams.seqs_to_admit(request) > self.config.max_num_seqs:
                break
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            if self.kv.is_being_computed(request, len(hit_blocks)):
                break  # its prefix is computed this step by another: hit it next step
            num_new = request.num_tokens - num_hit
            if num_new > token_budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = token_budget
            if self.kv.allocate_slots(request, num_new, hit_blocks) is None:
                break  # head-of-line: later requests do not overtake it
            waiting.pop()
            self._admit(request, num_hit)
            token_budget -= num_new
            new_seqs.append(self._new_seq(request, num_new, step_id))
        return new_seqs

    def _admit(self, request: Request, num_hit: int) -> None:
        request.status = RUNNING
        request.num_computed_tokens = num_hit
        self.num_prefix_cache_queries += request.num_tokens
        self.num_prefix_cache_hits += num_hit
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.time()
        self.sets.running.append(request)

    # -- what the workers are told -------------------------------------------------------------

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
            keep_sample=self._keep(request, num_new, 0, step_id),
        )
        _mark_sent(request, num_new, len(block_ids), step_id)
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
            keep_sample=self._keep(request, num_new, len(drafts), step_id),
        )
        _mark_sent(request, num_new, num_blocks, step_id)
        request.num_draft_tokens = len(drafts)
        return seq

    def _keep(self, request: Request, num_new: int, num_drafts: int, step_id: int) -> bool:
        """Whether this step samples `request` with the worker keeping the sample (a plain
        sequence: no drafts, beam or grammar; module docstring); noted on the request when
        it does (before `_mark_sent` advances it)."""
        keep = (
            self.config.async_scheduling
            and num_drafts == 0
            and request.beam_group_id is None
            and request.sampling.structured_output is None
            and request.num_computed_tokens + num_new >= request.num_tokens  # it samples
        )
        if keep:
            request.kept_sample_steps.append(step_id)
        return keep


def _mark_sent(request: Request, num_new: int, num_blocks: int, step_id: int) -> None:
    request.num_sent_tokens = len(request.all_token_ids)
    request.num_sent_blocks = num_blocks
    request.num_computed_tokens += num_new
    request.scheduled_step_id = step_id
    request.num_draft_tokens = 0
    request.needs_full_send = False
