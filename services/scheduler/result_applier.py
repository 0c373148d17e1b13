"""What a step's result does: the sampled tokens appended, finished requests freed, one
`TokenDelta` per sequence that got a token or finished.

A sequence aborted or preempted since its plan is skipped. With async scheduling a result
arrives after the next plan was made: a sample the worker kept (`Request.kept_sample_steps`)
is applied in plan order, and the worker already holds it, so it is never sent back. A step
that failed as a whole fails every sequence it ran; a sequence whose prompt was done but that
got no token (and was not deferred while its grammar compiles) fails with the worker's
reason, so that nothing waits forever. Accepted drafts count as computed only here: a
rejected draft's KV is overwritten later, and a block is hashed only over tokens the request
has.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from pagedserve.services.scheduler.beam_groups import BeamGroups
from pagedserve.services.scheduler.finish_rules import FINISH_ERROR, FINISH_LENGTH, check_stop
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_sets import RequestSets
from pagedserve.services.scheduler.speculation import next_max_drafts
from pagedserve.shared.config import SchedulerConfig
from pagedserve.shared.iteration_histogram import IterationHistogram
from pagedserve.shared.protocol import (
    ERROR_ENGINE,
    ERROR_INVALID_REQUEST,
    StepPlan,
    StepResult,
    TokenDelta,
)

logger = logging.getLogger(__name__)

RUNNING = RequestStatus.RUNNING


class ResultApplier:
    def __init__(self, config: SchedulerConfig, sets: RequestSets, beams: BeamGroups) -> None:
        self.config = config
        self.sets = sets
        self.beams = beams
        self.num_steps = 0
        # speculative decoding, as vLLM counts it: sequence-steps with drafts, drafts checked,
        # drafts accepted (a draft of a request that left before its result is not counted)
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []  # drafts accepted at each draft position
        self.iteration_tokens = IterationHistogram()  # tokens per step, for metrics

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[TokenDelta]:
        if result.step_id != plan.step_id:
            raise ValueError(f"result of step {result.step_id} given for plan {plan.step_id}")
        self.num_steps += 1
        self.iteration_tokens.observe(plan.num_scheduled_tokens)
        scheduled = self._live_scheduled(plan)
        if result.error is not None:
            deltas = [
                self._fail(r, result.error, ERROR_ENGINE)
                for r in scheduled
                if r.status is RUNNING  # a beam's group may have failed already
            ]
            self.sets.drop_finished_from_running()
            return [d for d in deltas if d is not None]
        for request in scheduled:
            if request.scheduled_step_id == plan.step_id:  # else a later plan reset the drafts
                request.num_computed_tokens -= request.num_draft_tokens  # accepted: `_append`
            self.sets.kv.cache_blocks(request)
        deltas = self._apply_samples(plan.step_id, result)
        deltas += self.beams.advance()
        self._rerun_deferred(plan.step_id, result.deferred_seq_ids)
        deltas += self._fail_unsampled(plan.step_id, scheduled, result.seq_errors)
        self.sets.drop_finished_from_running()
        return deltas

    def _live_scheduled(self, plan: StepPlan) -> list[Request]:
        """The plan's requests still running as it planned them (a later plan may have
        scheduled them again, on top of this one: async scheduling)."""
        live = []
        for seq in (*plan.new_seqs, *plan.cached_seqs):
            request = self.sets.requests.get(seq.seq_id)
            if (
                request is not None
                and request.status is RUNNING
                and request.scheduled_step_id >= plan.step_id
            ):
                live.append(request)
        return live

    def _apply_samples(self, step_id: int, result: StepResult) -> list[TokenDelta]:
        deltas = []
        now = time.time()
        requests = self.sets.requests
        for i, (seq_id, token_id) in enumerate(zip(result.seq_ids, result.token_ids, strict=True)):
            request = requests.get(seq_id)
            if request is None or request.status is not RUNNING:
                continue  # aborted or preempted since the plan
            kept = bool(request.kept_sample_steps) and request.kept_sample_steps[0] == step_id
            if kept:
                request.kept_sample_steps.pop(0)
                request.num_sent_tokens += 1  # the worker appended it itself
            elif request.scheduled_step_id != step_id or request.num_computed_tokens != len(
                request.all_token_ids
            ):
                logger.warning("step %d sampled %s, which it did not reach", step_id, seq_id)
                continue
            if request.first_token_time is None:
                request.first_token_time = now
            if request.beam_group_id is not None and result.top_logprobs is not None:
                self.beams.add_result(request, result.top_logprobs[i])
                continue
            prompt_logprobs = result.prompt_logprobs[i] if result.prompt_logprobs else None
            if request.sampling.max_tokens == 0:  # prompt only: done after the prefill
                deltas.append(
                    self.sets.finish(request, FINISH_LENGTH, prompt_logprobs=prompt_logprobs)
                )
                continue
            more = result.more_token_ids[i] if result.more_token_ids else []
            self._count_drafts(request.num_draft_tokens, len(more))
            if request.num_draft_tokens:
                request.max_next_drafts = next_max_drafts(request.num_draft_tokens, len(more))
            delta = self._append(request, [token_id, *more[: request.num_draft_tokens]], i, result)
            if prompt_logprobs is not None:
                delta = dataclasses.replace(delta, prompt_logprobs=prompt_logprobs)
            deltas.append(delta)
        return deltas

    def _count_drafts(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self.num_drafts += 1
            self.num_draft_tokens += num_drafts
            accepted = min(num_accepted, num_drafts)
            self.num_accepted_tokens += accepted
            if len(self.accepted_per_pos) < accepted:
                self.accepted_per_pos.extend([0] * (accepted - len(self.accepted_per_pos)))
            for position in range(accepted):  # drafts are accepted as a prefix
                self.accepted_per_pos[position] += 1

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
            if reason is not None:  # the stop token's logprob goes too, as vLLM lists it
                sampled = [*shown, token_id] if is_stop_token else shown
                logprobs, top_logprobs = _logprobs(request, sampled, index, result)
                return self.sets.finish(
                    request,
                    reason,
                    token_ids=shown,
                    logprobs=logprobs,
                    top_logprobs=top_logprobs,
                    stop_token_id=token_id if is_stop_token else None,
                )
        return _token_delta(request, shown, index, result)

    def _rerun_deferred(self, step_id: int, seq_ids: list[str]) -> None:
        """Sequences not sampled yet (their grammar is compiling) rerun their last token."""
        for request in filter(None, map(self.sets.requests.get, seq_ids)):
            if request.scheduled_step_id == step_id and request.num_computed_tokens == len(
                request.all_token_ids
            ):
                request.num_computed_tokens -= 1

    def _fail_unsampled(
        self, step_id: int, scheduled: list[Request], errors: dict[str, str]
    ) -> list[TokenDelta]:
        """A sequence whose step reached its last token must get one; without it, it would
        wait forever. Fail it loudly instead (with the worker's reason when it gave one: a
        grammar that does not compile is the request's fault)."""
        deltas = []
        for r in scheduled:
            if r.status is not RUNNING:
                continue
            if r.scheduled_step_id != step_id:  # planned again already: was its sample kept?
                if step_id not in r.kept_sample_steps:
                    continue
            elif r.num_computed_tokens != r.num_tokens:
                continue
            if r.beam_group_id is not None and self.beams.has_result(r):
                continue  # sampled; its group waits for the other beams
            error = errors.get(r.request_id) or (
                f"the worker returned no token for {r.request_id} in step {r.scheduled_step_id}"
            )
            code = ERROR_INVALID_REQUEST if r.request_id in errors else ERROR_ENGINE
            deltas.append(self._fail(r, error, code))
        return [d for d in deltas if d is not None]

    def _fail(self, request: Request, error: str, error_code: str) -> TokenDelta | None:
        """Fail a request, or the beam search that `request` is a beam of (once)."""
        fields = {"error": error, "error_code": error_code}
        if request.beam_group_id is not None:
            return self.beams.fail(request.beam_group_id, FINISH_ERROR, **fields)
        return self.sets.finish(request, FINISH_ERROR, **fields)


def _logprobs(
    request: Request, shown: list[int], index: int, result: StepResult
) -> tuple[list | None, list | None]:
    """The step's logprobs for the shown token (a request with logprobs gets one)."""
    if request.sampling.logprobs is None or result.logprobs is None:
        return None, None
    logprobs = [result.logprobs[index]][: len(shown)]
    top = None if result.top_logprobs is None else [result.top_logprobs[index]][: len(shown)]
    return logprobs, top


def _token_delta(request: Request, shown: list[int], index: int, result: StepResult) -> TokenDelta:
    logprobs, top_logprobs = _logprobs(request, shown, index, result)
    num_prompt = request.num_prompt_tokens
    return TokenDelta(
        request_id=request.request_id,
        token_ids=shown,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        num_prompt_tokens=num_prompt,
        num_output_tokens=len(request.all_token_ids) - num_prompt,
        num_cached_tokens=max(request.num_cached_tokens, 0),
        num_preemptions=request.num_preemptions,
    )
