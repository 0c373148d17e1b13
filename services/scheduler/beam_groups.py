"""Beam search requests as groups of sequences that share KV blocks (the PagedAttention
paper's design; the ranking rule is beam_search.py's).

A request with `beam_width` B starts as one sequence, its first beam, with the id
"{request id}/beam-0"; every beam is a sequence of its own to the planner and the workers,
asking for the top K logprobs of its next token. When every live beam of a group has its
step's result, the group takes its step:
- a beam chosen as the parent of one continuation keeps its sequence and appends the token;
- each further continuation of the same parent is a fork: a new sequence with the parent's
  tokens and block table (one more reference on each block, nothing copied); the first write
  into the shared last block copies it (`KVCacheManager.copy_on_write`), so beams hold their
  common ancestors' blocks once;
- a beam chosen by no continuation is pruned: its sequence ends and returns its blocks.
When the search ends, every beam returns its blocks and the request finishes with one delta
that carries the n best hypotheses.

A group is preempted whole (all its beams go back to the waiting queue and their pending
results are dropped): a step needs every beam's result, and a beam recomputed alone would
hold blocks its siblings wait for. A readmitted beam finds its full blocks in the prefix cache.
A running group reserves a `max_num_seqs` slot for each of its B beams.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from pagedserve.services.scheduler.beam_search import BeamSearch, Hypothesis, num_candidates
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_sets import RequestSets
from pagedserve.shared.protocol import BeamOutput, TokenDelta

RUNNING = RequestStatus.RUNNING


@dataclass(slots=True)
class BeamGroup:
    request_id: str  # the client's
    search: BeamSearch
    beams: list[Request]  # live beams, best first (the search's beam order)
    root: Request  # the first beam: its timeline stands for the request's
    results: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # this step's
    num_beams_made: int = 1

    def num_running(self) -> int:
        return sum(1 for b in self.beams if b.status is RUNNING)

    def is_ready(self) -> bool:
        return all(b.request_id in self.results for b in self.beams)


class BeamGroups:
    def __init__(self, sets: RequestSets, max_model_len: int) -> None:
        self.sets = sets
        self.kv = sets.kv
        self.max_model_len = max_model_len
        self.groups: dict[str, BeamGroup] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.groups

    def start(self, request: Request) -> None:
        """Queue the first beam of `request` (its sampling has `beam_width` > 0)."""
        sampling = request.sampling
        first = dataclasses.replace(
            request,
            request_id=f"{request.request_id}/beam-0",
            sampling=dataclasses.replace(sampling, logprobs=num_candidates(sampling)),
            beam_group_id=request.request_id,
        )
        search = BeamSearch(sampling, request.num_prompt_tokens, self.max_model_len)
        self.sets.add(first)
        self.groups[request.request_id] = BeamGroup(request.request_id, search, [first], first)

    # -- what the planner asks ---------------------------------------------------------------

    def members(self, request: Request) -> list[Request]:
        """The sequences preempted with `request`: its group's running beams, or itself."""
        group = self.groups.get(request.beam_group_id or "")
        return [request] if group is None else [b for b in group.beams if b.status is RUNNING]

    def num_reserved_seqs(self) -> int:
        """Slots of `max_num_seqs` that admitted groups hold for beams not running now."""
        return sum(
            g.search.width - g.num_running()
            for g in self.groups.values()
            if g.root.first_scheduled_time is not None
        )

    def seqs_to_admit(self, request: Request) -> int:
        """Slots of `max_num_seqs` that admitting `request` takes beyond the reserved ones."""
        group = self.groups.get(request.beam_group_id or "")
        if group is None:
            return 1
        return group.search.width if group.root.first_scheduled_time is None else 0

    def forget_results(self, request: Request | None = None) -> None:
        """`request` (None: every running sequence) was preempted: its group's step waits for
        results computed again."""
        for group in self.groups.values():
            if request is None or group.request_id == request.beam_group_id:
                group.results.clear()

    # -- what the result applier tells ---------------------------------------------------------

    def has_result(self, request: Request) -> bool:
        group = self.groups.get(request.beam_group_id or "")
        return group is not None and request.request_id in group.results

    def add_result(self, request: Request, top_logprobs: list[tuple[int, float]]) -> None:
        self.groups[request.beam_group_id or ""].results[request.request_id] = top_logprobs

    def advance(self) -> list[TokenDelta]:
        """Take a step in every group whose beams all have this step's result; the deltas of
        the requests that finished."""
        deltas = []
        for group in [g for g in self.groups.values() if g.results and g.is_ready()]:
            tops = [group.results[b.request_id] for b in group.beams]
            group.results.clear()
            step = group.search.step([b.output_token_ids for b in group.beams], tops)
            if step.done:
                deltas.append(self._finish(group))
            else:
                self._reassign(group, [(c.beam_index, c.token_id) for c in step.continuing])
        return deltas

    def fail(self, request_id: str, reason: str, **delta_fields) -> TokenDelta | None:
        """End the group of client request `request_id` now (an abort, a failed step);
        None if it already ended."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        for beam in group.beams:
            self.sets.drop(beam)
        self._record_finished(group.root, reason)
        delta_fields.setdefault("token_ids", [])
        return TokenDelta(
            request_id=request_id,
            finish_reason=reason,
            num_prompt_tokens=group.root.num_prompt_tokens,
            **delta_fields,
        )

    def _reassign(self, group: BeamGroup, continuing: list[tuple[int, int]]) -> None:
        """The next beams: parents keep their sequence for their first continuation, fork for
        each further one; parents without a continuation are pruned."""
        parents = group.beams
        kept: dict[int, int] = {}  # parent index -> its first continuation's token
        next_beams = []
        for beam_index, token_id in continuing:
            parent = parents[beam_index]
            if beam_index not in kept:
                kept[beam_index] = token_id
                next_beams.append(parent)
                continue
            child = parent.fork(f"{group.request_id}/beam-{group.num_beams_made}")
            group.num_beams_made += 1
            child.all_token_ids.append(token_id)
            self.kv.fork(parent, child)
            self.sets.add_running(child)
            next_beams.append(child)
        for beam_index, token_id in kept.items():  # after the forks copied the parents
            parents[beam_index].all_token_ids.append(token_id)
        for beam_index, parent in enumerate(parents):
            if beam_index not in kept:
                self.sets.drop(parent)
        group.beams = next_beams

    def _finish(self, group: BeamGroup) -> TokenDelta:
        del self.groups[group.request_id]
        for beam in group.beams:
            self.sets.drop(beam)
        best = group.search.best(group.search.sampling.n)
        outputs = [_beam_output(h) for h in best]
        self._record_finished(group.root, best[0].finish_reason)
        return TokenDelta(
            request_id=group.request_id,
            token_ids=outputs[0].token_ids,
            finish_reason=best[0].finish_reason,
            num_prompt_tokens=group.root.num_prompt_tokens,
            num_output_tokens=len(best[0].output_token_ids),
            num_cached_tokens=max(group.root.num_cached_tokens, 0),
            # the beams are preempted one by one: the most any of the last ones was
            num_preemptions=max((b.num_preemptions for b in group.beams), default=0),
            stop_token_id=best[0].stop_token_id,
            beams=outputs,
        )

    def _record_finished(self, root: Request, reason: str) -> None:
        root.finish_reason = reason
        root.finish_time = time.time()
        self.sets.record_finished(root)


def _beam_output(hypothesis: Hypothesis) -> BeamOutput:
    tokens = list(hypothesis.output_token_ids)
    if hypothesis.stop_token_id is not None:
        tokens = tokens[:-1]  # a stop token is counted, not shown
    return BeamOutput(
        token_ids=tokens,
        cumulative_logprob=hypothesis.cumulative_logprob,
        score=hypothesis.score,
        finish_reason=hypothesis.finish_reason,
        stop_token_id=hypothesis.stop_token_id,
    )
