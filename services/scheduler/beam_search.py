"""Beam search's rule for one request, step by step, as transformers' `generate(num_beams=B,
do_sample=False, length_penalty=...)` applies it (its vectorized `_beam_search`, which is also
the PagedAttention paper's description). No blocks and no scheduling here: beam_groups.py maps
beams onto sequences that share KV blocks.

Each step every live beam reports the top K log-probabilities of its next token (K = B times
max(2, 1 + number of stop tokens), so that B continuations survive however many of the best
end). A candidate's score is its beam's cumulative log-probability plus its own; the best K
over all beams are kept, best first:
- those that end (a stop token, or the length limit) and rank among the first B become
  finished hypotheses, scored by their cumulative log-probability divided by
  (generated length ** length_penalty), and the B best hypotheses are kept;
- the best B that do not end are the next step's beams (a beam's children share its blocks).
The search ends when every candidate ends (the length limit), or when B hypotheses are kept
and the best live beam, length-penalized at the current length, cannot beat the worst of them
(transformers' `early_stopping=False` heuristic).

Scores are kept in float32, rounded after each operation as transformers computes them, so
that near-equal candidates are ranked alike.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pagedserve.services.scheduler.finish_rules import FINISH_LENGTH, FINISH_STOP
from pagedserve.shared.protocol import SamplingParams
from pagedserve.shared.request_bounds import MAX_LOGPROBS

MAX_CANDIDATES = MAX_LOGPROBS  # the most top logprobs a worker reports per sequence
_FLOAT32 = struct.Struct("f")


def f32(value: float) -> float:
    """`value` rounded to the nearest float32."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


def stop_token_ids(sampling: SamplingParams) -> frozenset[int]:
    eos = () if sampling.ignore_eos else sampling.eos_token_ids
    return frozenset((*eos, *sampling.stop_token_ids))


def num_candidates(sampling: SamplingParams) -> int:
    """K: how many continuations each step keeps (transformers' `beams_to_keep`)."""
    per_beam = max(2, 1 + len(stop_token_ids(sampling)))
    return min(MAX_CANDIDATES, per_beam * sampling.beam_width)


@dataclass(frozen=True, slots=True)
class Candidate:
    beam_index: int  # which of this step's beams it extends
    token_id: int
    score: float  # cumulative log-probability, float32


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A finished beam: its output tokens (a stop token included, last) and scores."""

    output_token_ids: tuple[int, ...]
    cumulative_logprob: float
    score: float  # cumulative_logprob / len(output_token_ids) ** length_penalty
    finish_reason: str
    stop_token_id: int | None


@dataclass(frozen=True, slots=True)
class BeamStep:
    """What one step decided: the next beams (best first) and whether the search is over."""

    continuing: list[Candidate]
    done: bool


@dataclass(slots=True)
class BeamSearch:
    """The search state of one request: live beams' scores and the finished hypotheses."""

    sampling: SamplingParams
    num_prompt_tokens: int
    max_model_len: int
    beam_scores: list[float] = field(default_factory=lambda: [0.0])  # per live beam
    hypotheses: list[Hypothesis] = field(default_factory=list)  # best first, <= beam_width

    @property
    def width(self) -> int:
        return self.sampling.beam_width

    def step(
        self,
        outputs: list[list[int]],  # per live beam, its output tokens so far
        top_logprobs: list[list[tuple[int, float]]],  # per live beam, best first
    ) -> BeamStep:
        num_output = len(outputs[0]) + 1  # every beam has the same length
        candidates = self._best_candidates(top_logprobs, num_output)
        ends = [self._ends(c.token_id, num_output) for c in candidates]
        for rank, (candidate, end) in enumerate(zip(candidates, ends, strict=True)):
            if end and rank < self.width:
                self._keep(candidate, outputs[candidate.beam_index], num_output)
        continuing = [c for c, end in zip(candidates, ends, strict=True) if not end][: self.width]
        self.beam_scores = [c.score for c in continuing]
        done = not continuing or self._cannot_improve(continuing[0].score, num_output)
        return BeamStep(continuing, done)

    def best(self, n: int) -> list[Hypothesis]:
        return self.hypotheses[:n]

    def _best_candidates(
        self, top_logprobs: list[list[tuple[int, float]]], num_output: int
    ) -> list[Candidate]:
        stops = stop_token_ids(self.sampling)
        banned = stops if num_output <= self.sampling.min_tokens else frozenset()
        candidates = [
            Candidate(beam, token_id, f32(self.beam_scores[beam] + f32(logprob)))
            for beam, top in enumerate(top_logprobs)
            for token_id, logprob in top
            if token_id not in banned
        ]
        # transformers' top-k over the flattened [beam, token] scores: ties by flat index
        candidates.sort(key=lambda c: (-c.score, c.beam_index, c.token_id))
        return candidates[: num_candidates(self.sampling)]

    def _ends(self, token_id: int, num_output: int) -> bool:
        return (
            token_id in stop_token_ids(self.sampling)
            or num_output >= self.sampling.max_tokens
            or self.num_prompt_tokens + num_output >= self.max_model_len
        )

    def _keep(self, candidate: Candidate, output: list[int], num_output: int) -> None:
        stopped = candidate.token_id in stop_token_ids(self.sampling)
        hypothesis = Hypothesis(
            output_token_ids=(*output, candidate.token_id),
            cumulative_logprob=candidate.score,
            score=f32(candidate.score / f32(num_output**self.sampling.length_penalty)),
            finish_reason=FINISH_STOP if stopped else FINISH_LENGTH,
            stop_token_id=candidate.token_id if stopped else None,
        )
        self.hypotheses.append(hypothesis)
        self.hypotheses.sort(key=lambda h: -h.score)  # stable: earlier ones win ties
        del self.hypotheses[self.width :]

    def _cannot_improve(self, best_live_score: float, num_output: int) -> bool:
        if len(self.hypotheses) < self.width:
            return False
        best_possible = f32(best_live_score / f32(num_output**self.sampling.length_penalty))
        return best_possible <= self.hypotheses[-1].score
