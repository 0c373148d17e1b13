"""Batched token sampling on rank 0.

Order of operations, as vLLM does it: penalties (repetition over prompt + output, presence and
frequency over output) and the min_tokens mask of EOS/stop tokens apply to the raw logits; then
greedy rows take the argmax, the others divide by temperature, drop tokens outside top_k /
top_p / min_p and sample. Reported logprobs are those of the raw model distribution
(log_softmax of the unprocessed logits), for the sampled token and the top k alternatives.

Seeded rows draw their noise from a generator seeded by (seed, number of output tokens so far),
so a seeded request samples the same tokens whatever else shares its batch and across
preemption. Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)), which is
a draw from p and needs one noise vector per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.protocol import SamplingParams

_SEED_STRIDE = 1_000_003  # mixes (seed, step) into one generator seed
MAX_LOGPROBS = 20


@dataclass(slots=True)
class SamplingRow:
    """One sequence to sample: its parameters and token history."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float] | None  # per row, when any row asked for logprobs
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, best first


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)  # [B, 1]


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition penalty over prompt + output tokens; presence and frequency over output."""
    batch, vocab = logits.shape
    device = logits.device
    rep = _column([r.params.repetition_penalty for r in rows], device)
    presence = _column([r.params.presence_penalty for r in rows], device)
    frequency = _column([r.params.frequency_penalty for r in rows], device)
    output_counts = torch.zeros((batch, vocab), dtype=torch.float32, device=device)
    seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):  # building the [B, V] histories needs each row's ids once
        if row.output_token_ids:
            out = torch.tensor(row.output_token_ids, device=device)
            output_counts[i].index_add_(0, out, torch.ones(len(out), device=device))
        if row.params.repetition_penalty != 1.0 and row.prompt_token_ids:
            seen[i, torch.tensor(row.prompt_token_ids, device=device)] = True
    seen |= output_counts > 0
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    logits = logits - frequency * output_counts - presence * (output_counts > 0).float()
    return logits


def mask_min_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """EOS and stop tokens cannot be sampled before a row has min_tokens outputs."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    for i, row in enumerate(rows):
        p = row.params
        if len(row.output_token_ids) < p.min_tokens:
            blocked = set(p.stop_token_ids) | (set() if p.ignore_eos else set(p.eos_token_ids))
            row_ids.extend([i] * len(blocked))
            token_ids.extend(blocked)
    if row_ids:
        logits = logits.clone()
        logits[torch.tensor(row_ids), torch.tensor(token_ids)] = float("-inf")
    return logits


def filter_logits(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature-scaled logits with tokens outside top_k / top_p / min_p set to -inf."""
    device = logits.device
    temperature = _column([max(r.params.temperature, 1e-5) for r in rows], device)
    logits = logits / temperature
    vocab = logits.shape[1]
    top_k = [r.params.top_k if r.params.top_k > 0 else vocab for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)  # [1, V]
        drop = ranks >= torch.tensor(top_k, device=device).unsqueeze(1)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # keeps the token that crosses top_p
        drop |= mass_before > _column(top_p, device)
        drop[:, 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    min_p = [r.params.min_p for r in rows]
    if any(p > 0 for p in min_p):
        probs = logits.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * _column(min_p, device)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def exponential_noise(rows: list[SamplingRow], vocab: int, device: torch.device) -> torch.Tensor:
    noise = torch.empty((len(rows), vocab), dtype=torch.float32, device=device).exponential_()
    for i, row in enumerate(rows):
        if row.params.seed is not None:
            generator = torch.Generator(device=device)
            step = len(row.output_token_ids)
            generator.manual_seed((row.params.seed * _SEED_STRIDE + step) % (2**63))
            noise[i].exponential_(generator=generator)
    return noise


def _needs_penalties(rows: list[SamplingRow]) -> bool:
    return any(
        r.params.repetition_penalty != 1.0
        or r.params.presence_penalty != 0.0
        or r.params.frequency_penalty != 0.0
        for r in rows
    )


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
    """One token per row of float32 `logits` [B, V]."""
    raw_logits = logits
    if _needs_penalties(rows):
        logits = apply_penalties(logits, rows)
    logits = mask_min_tokens(logits, rows)
    token_ids = logits.argmax(dim=-1)
    random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if random_rows:
        index = torch.tensor(random_rows, device=logits.device)
        sub_rows = [rows[i] for i in random_rows]
        filtered = filter_logits(logits[index], sub_rows)
        probs = filtered.softmax(dim=-1)
        noise = exponential_noise(sub_rows, probs.shape[1], probs.device)
        token_ids[index] = (probs / noise).argmax(dim=-1)
    return _with_logprobs(raw_logits, token_ids, rows)


def _with_logprobs(
    raw_logits: torch.Tensor, token_ids: torch.Tensor, rows: list[SamplingRow]
) -> SamplerOutput:
    requested = [r.params.logprobs for r in rows]
    ids = token_ids.tolist()
    if all(k is None for k in requested):
        return SamplerOutput(ids, None, None)
    logprobs = raw_logits.log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
    max_k = max((k or 0) for k in requested)
    top: list[list[tuple[int, float]]] = [[] for _ in rows]
    if max_k > 0:
        values, indices = logprobs.topk(min(max_k, MAX_LOGPROBS), dim=-1)
        values_l, indices_l = values.tolist(), indices.tolist()
        for i, k in enumerate(requested):
            top[i] = list(zip(indices_l[i][: k or 0], values_l[i][: k or 0], strict=True))
    return SamplerOutput(ids, chosen, top)
