"""The workers' half of n-gram speculative decoding (the scheduler's is
`services/scheduler/speculation.py`): which of a sequence's draft tokens it keeps.

A sequence with drafts d1..dk had its last known token and the drafts computed in one step;
the logits after the last known token gave the step's token g0 (sampled as any other), those
after each draft di give gi, sampled here by the same sampler with the history that draft
implies. While each draft equals the token sampled before it (d1 == g0, d2 == g1, ...), its
row saw the right context, so the token sampled after it is output too: g0, g1, ..., ga for
a drafts kept. For greedy sequences (the only ones the scheduler drafts for) these are
exactly the tokens one-at-a-time decoding gives.
"""

from __future__ import annotations

import dataclasses

import torch

from pagedserve.services.gpu_worker.sampler import SamplingRow, sample
from pagedserve.services.gpu_worker.sequence_state import SequenceState
from pagedserve.shared.protocol import StepResult


def verify_drafts(
    result: StepResult,
    draft_logits: torch.Tensor,  # [sum of drafts, V]: after each draft, in `sampled` order
    sampled: list[SequenceState],
) -> StepResult:
    """`result` with `more_token_ids`: per sampled sequence, the drafts kept and the token
    after them ([] for a sequence without drafts)."""
    drafted = [s for s in sampled if s.draft_token_ids]
    rows = [
        SamplingRow(
            state.sampling,
            state.token_ids[: state.num_prompt_tokens],
            state.token_ids[state.num_prompt_tokens :] + state.draft_token_ids[: i + 1],
        )
        for state in drafted
        for i in range(len(state.draft_token_ids))
    ]
    after_drafts = iter(sample(draft_logits, rows).token_ids)
    first_token = dict(zip(result.seq_ids, result.token_ids, strict=True))
    more: dict[str, list[int]] = {}
    for state in drafted:
        sampled_after = [next(after_drafts) for _ in state.draft_token_ids]
        if state.seq_id in first_token:
            more[state.seq_id] = accepted(
                state.draft_token_ids, first_token[state.seq_id], sampled_after
            )
    more_token_ids = [more.get(seq_id, []) for seq_id in result.seq_ids]
    return dataclasses.replace(result, more_token_ids=more_token_ids)


def accepted(drafts: list[int], first: int, sampled_after: list[int]) -> list[int]:
    """The tokens that follow `first` (sampled after the last known token): while draft i
    equals the token sampled before it, the token sampled after draft i is output too."""
    sampled = [first, *sampled_after]  # sampled[i]: after the last known token, then drafts[i - 1]
    kept = 0
    while kept < len(drafts) and drafts[kept] == sampled[kept]:
        kept += 1
    return sampled[1 : kept + 1]
