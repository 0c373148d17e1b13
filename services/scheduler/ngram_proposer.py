"""Draft tokens by prompt lookup (n-gram speculation, as vLLM's `ngram` method).

A sequence's last n tokens (n from `max_n` down to `min_n`) are looked for earlier in its own
prompt and output; the tokens that followed the most recent earlier match are the draft. The
model then checks every draft token in one step (`speculation.py`): greedy output is exactly
what it would have been without drafts, only reached in fewer steps when drafts are right,
as they often are where a text repeats or quotes its prompt.
"""

from __future__ import annotations

MAX_N = 4
MIN_N = 2


def propose_ngram(
    tokens: list[int], num_tokens: int, max_n: int = MAX_N, min_n: int = MIN_N
) -> list[int]:
    """Up to `num_tokens` draft tokens to follow `tokens`, or [] when no n-gram recurs."""
    if num_tokens <= 0:
        return []
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = tokens[length - n :]
        last = pattern[-1]
        # the most recent earlier occurrence (it may overlap the suffix, not be it)
        for end in range(length - 2, n - 2, -1):
            if tokens[end] == last and tokens[end - n + 1 : end + 1] == pattern:
                return tokens[end + 1 : end + 1 + num_tokens]
    return []
