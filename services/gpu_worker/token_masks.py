"""Per-request token masks on the logits: vLLM's `allowed_token_ids` (a whitelist: every other
token gets -inf) and `bad_words` (a word's last token gets -inf when the output so far ends
with the word's other tokens; a one-token word is always masked).

Both apply to the raw logits before logit_bias and penalties, as vLLM v1's sampler applies
them first; the reported logprobs stay those of the raw distribution."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedserve.shared.protocol import SamplingParams


def has_token_masks(params: SamplingParams) -> bool:
    return params.allowed_token_ids is not None or bool(params.bad_words_token_ids)


def banned_token_ids(
    bad_words: Sequence[Sequence[int]], output_token_ids: Sequence[int]
) -> list[int]:
    """The last token of every bad word whose earlier tokens end the output (vLLM matches
    against the output only, not the prompt)."""
    banned = []
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or (
            len(prefix) <= len(output_token_ids)
            and list(output_token_ids[len(output_token_ids) - len(prefix) :]) == list(prefix)
        ):
            banned.append(word[-1])
    return banned


def apply_token_masks(
    logits: torch.Tensor,  # [B, V]
    params: Sequence[SamplingParams],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """`logits` with each row's disallowed and banned tokens at -inf (a copy when any row has
    a mask; `logits` itself otherwise)."""
    masked_rows = [i for i, p in enumerate(params) if has_token_masks(p)]
    if not masked_rows:
        return logits
    logits = logits.clone()
    for i in masked_rows:
        p = params[i]
        if p.allowed_token_ids is not None:
            keep = torch.tensor(p.allowed_token_ids, dtype=torch.long, device=logits.device)
            row = torch.full_like(logits[i], float("-inf"))
            row[keep] = logits[i, keep]
            logits[i] = row
        banned = banned_token_ids(p.bad_words_token_ids, output_token_ids[i])
        if banned:
            logits[i, torch.tensor(banned, dtype=torch.long, device=logits.device)] = float("-inf")
    return logits
