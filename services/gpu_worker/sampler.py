"""Batched token sampling on rank 0.

Order of operations, as vLLM (v1) does it: the allowed_token_ids and bad_words masks
(token_masks.py), logit_bias, penalties (repetition over prompt + output, presence and
frequency over output), a grammar's mask and the min_tokens mask of EOS/stop tokens apply to
the raw logits; greedy rows (temperature < 1e-5) take the argmax; the others divide by
temperature, drop tokens below min_p times the best token's probability, keep the top_k best,
then the smallest set of those whose mass (renormalized over what top_k kept) reaches top_p,
and sample. Reported logprobs are those of the raw model distribution (log_softmax of the
unprocessed logits), for the sampled token and the top k alternatives.

A row is sampled by inverse CDF: one uniform u per row, and the token whose interval of the
cumulative distribution holds u. Seeded rows draw u from a generator seeded by (seed, number
of output tokens so far), so a seeded request samples the same tokens whatever else shares its
batch and across preemption. (The exponential race vLLM uses on GPUs, argmax of p / E with
E ~ Exp(1), needs a vocabulary of noise per row: on this CPU 60 ms per step at batch 64 for
SmolLM2's 49152 tokens, against ~6 ms for the cumulative sum.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.layers.argmax import Argmax
from pagedserve.services.gpu_worker.token_masks import apply_token_masks, has_token_masks
from pagedserve.shared.protocol import GREEDY_TEMPERATURE, SamplingParams
from pagedserve.shared.request_bounds import MAX_LOGPROBS

_SEED_STRIDE = 1_000_003  # mixes (seed, step) into one generator seed
_MASK64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    """A 64-bit bijection that spreads every input bit over the output. torch's CPU generator
    (mt19937) keeps only the low 32 bits of its seed, so without it seeds that differ by a
    multiple of 2**32 (-1 and 2**63 - 1, say) would draw the same numbers."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass(slots=True)
class SamplingRow:
    """One sequence to sample: its parameters and token history."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass(frozen=True, slots=True)
class AllowedTokens:
    """Structured outputs' masks for some rows: token t is allowed in row `row_ids[i]` when bit
    t % 32 of `bitmask[i, t // 32]` is set (xgrammar's and llguidance's layout)."""

    row_ids: list[int]
    bitmask: torch.Tensor  # [len(row_ids), ceil(V / 32)] int32


def apply_allowed_tokens(
    logits: torch.Tensor, allowed: AllowedTokens, copy: bool = True
) -> torch.Tensor:
    """`logits` with -inf on every token that `allowed` forbids in its rows; in place unless
    `copy` (the raw logits are still needed for the reported logprobs).

    xgrammar's CPU kernel does it (the layout is the same): unpacking the bits with torch ops
    was ~6x slower on this CPU (396 vs 64 ms for 64 rows of 49152 under load)."""
    import xgrammar

    if copy:
        logits = logits.clone()
    words = torch.full((logits.shape[0], allowed.bitmask.shape[1]), -1, dtype=torch.int32)
    words[torch.tensor(allowed.row_ids)] = allowed.bitmask.cpu()
    xgrammar.apply_token_bitmask_inplace(
        logits, words.to(logits.device), vocab_size=logits.shape[1], indices=allowed.row_ids
    )
    return logits


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


def apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """OpenAI's logit_bias: a per-token value added to the raw logits (before penalties)."""
    row_ids = [i for i, row in enumerate(rows) for _ in row.params.logit_bias]
    if not row_ids:
        return logits
    token_ids = [t for row in rows for t, _ in row.params.logit_bias]
    biases = [b for row in rows for _, b in row.params.logit_bias]
    logits = logits.clone()
    device = logits.device
    logits[torch.tensor(row_ids, device=device), torch.tensor(token_ids, device=device)] += (
        torch.tensor(biases, dtype=logits.dtype, device=device)
    )
    return logits


def mask_min_tokens(
    logits: torch.Tensor, rows: list[SamplingRow], constrained: frozenset[int] = frozenset()
) -> torch.Tensor:
    """EOS and stop tokens cannot be sampled before a row has min_tokens outputs (as vLLM),
    also where a grammar would allow ending: the format may not end early. A `constrained`
    row whose grammar allows nothing else (its format is complete) keeps them: the format
    then decides where the output ends."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    for i, row in enumerate(rows):
        p = row.params
        if len(row.output_token_ids) < p.min_tokens:
            blocked = set(p.stop_token_ids) | (set() if p.ignore_eos else set(p.eos_token_ids))
            if i in constrained and not _has_other_token(logits[i], blocked):
                continue
            row_ids.extend([i] * len(blocked))
            token_ids.extend(blocked)
    if row_ids:
        logits = logits.clone()
        logits[torch.tensor(row_ids), torch.tensor(token_ids)] = float("-inf")
    return logits


def _has_other_token(row_logits: torch.Tensor, blocked: set[int]) -> bool:
    """Whether a token outside `blocked` can still be sampled from `row_logits` [V]."""
    finite = torch.isfinite(row_logits)
    finite[torch.tensor(sorted(blocked), dtype=torch.long)] = False
    return bool(finite.any())


TOP_CANDIDATES = (256, 4096)  # top-k / top-p try these many best tokens before a full sort


def _top_k_top_p_drop(
    sorted_logits: torch.Tensor,  # [R, C] each row's C best, descending
    log_total: torch.Tensor,  # [R, 1] logsumexp of each whole row
    top_k: torch.Tensor,  # [R, 1]
    top_p: torch.Tensor,  # [R, 1]
) -> torch.Tensor:  # [R, C] bool
    """Which of the sorted candidates top_k and then top_p drop; the best one always stays.
    top_p is measured on what top_k kept, renormalized (vLLM, HF): a row whose top_k lies
    inside the candidates is normalized by their first k, any other by the whole row (exact
    when its top_k is disabled; the caller finalizes the rest only after a full sort)."""
    ranks = torch.arange(sorted_logits.shape[1], device=sorted_logits.device).unsqueeze(0)
    outside_k = ranks >= top_k
    kept = sorted_logits.masked_fill(outside_k, float("-inf"))
    inside = top_k <= sorted_logits.shape[1]
    log_kept = torch.where(inside, kept.logsumexp(dim=-1, keepdim=True), log_total)
    probs = (kept - log_kept).exp()  # their share of the mass top_k kept
    mass_before = probs.cumsum(dim=-1) - probs  # keeps the token that crosses top_p
    drop = outside_k | ((mass_before >= top_p) & (top_p < 1.0))
    drop[:, 0] = False
    return drop


def _filtered(
    sorted_logits: torch.Tensor, order: torch.Tensor, drop: torch.Tensor, vocab: int
) -> torch.Tensor:
    """[R, V] logits holding only the kept candidates, -inf elsewhere."""
    kept = sorted_logits.masked_fill(drop, float("-inf"))
    full = torch.full((kept.shape[0], vocab), float("-inf"), device=kept.device)
    return full.scatter(1, order, kept)


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """`logits` with every token outside each row's top_k, then top_p, set to -inf.

    Sorting a whole vocabulary per row is slow on CPU (226 ms for 64 rows of 49152), so each
    row's best TOP_CANDIDATES[0] come from `topk` (11 ms) and are filtered there. That is
    exact for a row whose top_k fits in them, or whose top_k is off and whose candidates
    already hold more than its top_p of the mass (the nucleus then lies inside them); the
    other rows try the next size, and what is left after the last gets a full sort."""
    vocab = logits.shape[1]
    k_column = torch.tensor(top_k, device=logits.device).unsqueeze(1)
    p_column = _column(top_p, logits.device)
    log_total = logits.logsumexp(dim=-1, keepdim=True)
    out = torch.empty_like(logits)
    pending = torch.arange(logits.shape[0], device=logits.device)
    for size in (*(c for c in TOP_CANDIDATES if c < vocab), vocab):
        rows = logits[pending]
        if size < vocab:
            values, order = rows.topk(size, dim=-1)  # sorted, descending
        else:
            values, order = rows.sort(dim=-1, descending=True)
        k_pending = k_column[pending]
        drop = _top_k_top_p_drop(values, log_total[pending], k_pending, p_column[pending])
        nucleus_inside = (k_pending >= vocab) & drop[:, -1:]  # top_k off, top_p cut before C
        done = ((k_pending <= size) | nucleus_inside).squeeze(1) | (size == vocab)
        if bool(done.all()) and len(pending) == len(out):
            return _filtered(values, order, drop, vocab)  # every row in one pass: no copy
        out[pending[done]] = _filtered(values[done], order[done], drop[done], vocab)
        pending = pending[~done]
        if not pending.numel():
            break
    return out


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the best token's."""
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * _column(min_p, logits.device)
    return logits.masked_fill(probs < threshold, float("-inf"))


def filter_logits(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature-scaled logits with tokens outside min_p, then top_k, then top_p set to
    -inf (vLLM's order: min_p on the whole distribution, top_p on what top_k kept)."""
    device = logits.device
    temperature = _column([max(r.params.temperature, GREEDY_TEMPERATURE) for r in rows], device)
    logits = logits / temperature
    min_p = [r.params.min_p for r in rows]
    if any(p > 0 for p in min_p):
        logits = apply_min_p(logits, min_p)
    vocab = logits.shape[1]
    top_k = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        logits = apply_top_k_top_p(logits, top_k, top_p)
    return logits


def row_uniforms(rows: list[SamplingRow], device: torch.device) -> torch.Tensor:  # [R, 1]
    """One uniform in [0, 1) per row; a seeded row's comes from (seed, its step)."""
    uniforms = torch.rand((len(rows), 1), dtype=torch.float32, device=device)
    for i, row in enumerate(rows):
        if row.params.seed is not None:
            generator = torch.Generator(device=device)
            step = len(row.output_token_ids)
            generator.manual_seed(_splitmix64((row.params.seed * _SEED_STRIDE + step) & _MASK64))
            uniforms[i] = torch.rand(1, generator=generator, device=device)
    return uniforms


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row of `probs` [R, V], the token whose CDF interval holds u * total: the first
    token whose cumulative mass exceeds it, so a token of zero mass is never chosen."""
    cdf = probs.cumsum(dim=-1)
    targets = (uniforms * cdf[:, -1:]).contiguous()
    token_ids = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    past_end = token_ids >= probs.shape[1]  # u * total rounded up to the total itself
    if bool(past_end.any()):
        last_with_mass = probs.shape[1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)
        token_ids = torch.where(past_end, last_with_mass, token_ids)
    return token_ids


def _has_penalties(row: SamplingRow) -> bool:
    p = row.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _needs_penalties(rows: list[SamplingRow]) -> bool:
    return any(_has_penalties(r) for r in rows)


def _only_argmax(row: SamplingRow) -> bool:
    """The row's token is the argmax of its raw logits: greedy, nothing changes the logits
    first and no logprobs are reported."""
    p = row.params
    return (
        p.is_greedy
        and p.logprobs is None
        and not p.logit_bias
        and not has_token_masks(p)
        and not _has_penalties(row)
        and len(row.output_token_ids) >= p.min_tokens
    )


# the sampler's greedy pick when the caller does not give the one of its platform
DEFAULT_ARGMAX = Argmax()


def sample(
    logits: torch.Tensor,
    rows: list[SamplingRow],
    allowed: AllowedTokens | None = None,
    argmax: Argmax = DEFAULT_ARGMAX,
) -> SamplerOutput:
    """One token per row of `logits` [B, V] (float32, or the model's dtype, which rows that
    only take the argmax read as it is and others in float32); rows that `allowed` constrains
    sample only tokens it allows (logprobs stay those of the raw distribution)."""
    if logits.dtype != torch.float32:
        if not (allowed and allowed.row_ids) and all(_only_argmax(r) for r in rows):
            return SamplerOutput(argmax(logits).tolist(), None, None)
        logits = logits.float()
    raw_logits = logits
    logits = apply_token_masks(logits, [r.params for r in rows], [r.output_token_ids for r in rows])
    logits = apply_logit_bias(logits, rows)
    if _needs_penalties(rows):
        logits = apply_penalties(logits, rows)
    constrained: frozenset[int] = frozenset()
    if allowed is not None and allowed.row_ids:
        # A copy of the whole batch's logits only when they are still the raw ones and some
        # row reports logprobs (the caller does not read them after sampling).
        wants_logprobs = any(r.params.logprobs is not None for r in rows)
        logits = apply_allowed_tokens(logits, allowed, copy=logits is raw_logits and wants_logprobs)
        constrained = frozenset(allowed.row_ids)
    logits = mask_min_tokens(logits, rows, constrained)
    token_ids = argmax(logits)
    random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if random_rows:
        index = torch.tensor(random_rows, device=logits.device)
        sub_rows = [rows[i] for i in random_rows]
        probs = filter_logits(logits[index], sub_rows).softmax(dim=-1)
        token_ids[index] = inverse_cdf_sample(probs, row_uniforms(sub_rows, probs.device))
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
