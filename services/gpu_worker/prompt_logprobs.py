"""Prompt logprobs: the model's log-softmax at every prompt position, as vLLM's
`prompt_logprobs` (and the completions API's `echo` with `logprobs`) report them.

Position i of a prompt predicts token i + 1, so a step that computes prompt positions
[a, b) yields the logprobs of tokens a + 1 .. b (never past the prompt's last token). Chunked
prefill spreads a prompt over several steps: each sequence collects its entries as its chunks
run and hands the whole list over with its first sampled token. The scheduler never serves such
a sequence from the prefix cache, so every position is computed here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagedserve.shared.protocol import PromptLogprobs

ROWS_PER_CHUNK = 256  # [256, 49152] float32 logits: 48 MiB at a time


@dataclass(slots=True)
class PromptLogprobsCollector:
    """One sequence's prompt logprobs, filled chunk by chunk."""

    num_prompt_tokens: int
    k: int  # top alternatives per position
    token_logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    sent: bool = False

    @property
    def complete(self) -> bool:
        return len(self.token_logprobs) == max(self.num_prompt_tokens - 1, 0)

    def take(self) -> PromptLogprobs | None:
        """The whole list, once, when complete."""
        if self.sent or not self.complete:
            return None
        self.sent = True
        return PromptLogprobs(self.token_logprobs, self.ranks, self.top_logprobs)


@dataclass(frozen=True, slots=True)
class PromptSlice:
    """Rows of a packed step whose hidden states predict prompt tokens of one sequence."""

    collector: PromptLogprobsCollector
    first_row: int  # in the step's packed hidden states
    target_ids: list[int]  # the prompt tokens those rows predict


def prompt_slice(
    collector: PromptLogprobsCollector | None,
    token_ids: list[int],
    num_computed: int,
    num_scheduled: int,
    first_row: int,
) -> PromptSlice | None:
    """The part of a sequence's scheduled tokens [num_computed, +num_scheduled) that predicts
    a prompt token, or None."""
    if collector is None or collector.sent:
        return None
    end = min(num_computed + num_scheduled, collector.num_prompt_tokens - 1)
    if end <= num_computed:
        return None
    return PromptSlice(collector, first_row, token_ids[num_computed + 1 : end + 1])


def collect_prompt_logprobs(
    hidden: torch.Tensor,  # [T, H] the step's packed hidden states
    slices: list[PromptSlice],
    compute_logits: Callable[[torch.Tensor], torch.Tensor | None],
) -> None:
    """Fill each slice's collector. Every tensor-parallel rank must call this (computing
    logits gathers over ranks); only rank 0, which gets the logits, records anything."""
    rows = [s.first_row + i for s in slices for i in range(len(s.target_ids))]
    targets = [t for s in slices for t in s.target_ids]
    owners = [(s.collector, s.collector.k) for s in slices for _ in s.target_ids]
    row_index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
    for start in range(0, len(rows), ROWS_PER_CHUNK):
        stop = start + ROWS_PER_CHUNK
        logits = compute_logits(hidden[row_index[start:stop]])  # [C, V] on rank 0
        if logits is None:
            continue
        _record(logits, targets[start:stop], owners[start:stop])


def _record(
    logits: torch.Tensor,  # [C, V]
    targets: list[int],
    owners: list[tuple[PromptLogprobsCollector, int]],
) -> None:
    logprobs = logits.float().log_softmax(dim=-1)
    target = torch.tensor(targets, dtype=torch.long, device=logits.device).unsqueeze(1)
    chosen = logprobs.gather(1, target)  # [C, 1]
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    max_k = max(k for _, k in owners)
    top_values: list[list[float]] = [[] for _ in owners]
    top_ids: list[list[int]] = [[] for _ in owners]
    if max_k > 0:
        values, ids = logprobs.topk(max_k, dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    for i, (collector, k) in enumerate(owners):
        collector.token_logprobs.append(float(chosen[i, 0]))
        collector.ranks.append(int(ranks[i]))
        collector.top_logprobs.append(list(zip(top_ids[i][:k], top_values[i][:k], strict=True)))
