"""Draft tokens by prompt lookup (n-gram speculation, as vLLM's `ngram` method), carried on
where the text repeats with a period shorter than the drafts or counts.

A sequence's last n tokens (n from `max_n` down to `min_n`) are looked for earlier in its own
prompt and output; the tokens that followed the most recent earlier match are the draft. The
model then checks every draft token in one step (`speculation.py`): greedy output is exactly
what it would have been without drafts, only reached in fewer steps when drafts are right,
as they often are where a text repeats or quotes its prompt.

Two rules go beyond the tokens that followed the match, each only a guess the model checks:
- *The period continues.* A match that ends p tokens before the end (" of the of the": p = 2)
  is followed by fewer known tokens than the drafts asked for; the text is taken to go on
  repeating those p tokens. vLLM's proposer stops at the end (2 drafts there, not 3).
- *A count goes on counting.* Where the match occurred twice and the tokens that followed the
  two differ, position by position, by 0 or by one token id, and by one somewhere (" 2013" then
  " 2014", digits split into tokens with consecutive ids, as byte-level BPE vocabularies keep
  them), the draft adds that difference once more: " 2015". A token id that would leave the
  vocabulary keeps the plain draft, as does a vocabulary of unknown size.
"""

from __future__ import annotations

from array import array

WORD = array("I").itemsize  # token ids as unsigned 32-bit words
MAX_N = 4
MIN_N = 2


def propose_ngram(
    tokens: list[int],
    num_tokens: int,
    max_n: int = MAX_N,
    min_n: int = MIN_N,
    vocab_size: int = 0,
) -> list[int]:
    """Up to `num_tokens` draft tokens to follow `tokens`, or [] when no n-gram recurs.
    `vocab_size` > 0 lets a count go on (drafts stay below it); 0: the plain lookup.

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
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = words[(length - n) * WORD :]
        # the most recent earlier occurrence (it may overlap the suffix, not be it)
        last = _rfind_token(words, pattern, length - 1)
        if last < 0:
            continue
        drafts = _continuation(tokens, last + n, num_tokens)
        if vocab_size > 0:
            before = _rfind_token(words, pattern, last + n - 1)  # the one before that
            if before >= 0:
                earlier = tokens[before + n : before + n + len(drafts)]
                drafts = _counted_on(earlier, drafts, vocab_size)
        return drafts
    return []


def _rfind_token(words: bytes, pattern: bytes, end: int) -> int:
    """The token index where the last occurrence of `pattern` that ends by token `end` starts,
    or -1. A byte match straddling two tokens does not count: the search looks further back."""
    stop = end * WORD
    while (found := words.rfind(pattern, 0, stop)) >= 0:
        if found % WORD == 0:
            return found // WORD
        stop = found + len(pattern) - 1
    return -1


def _continuation(tokens: list[int], follows: int, num_tokens: int) -> list[int]:
    """`num_tokens` tokens from index `follows` on, the text past its end taken to repeat its
    last `len(tokens) - follows` tokens (the period of the match)."""
    drafts = tokens[follows : follows + num_tokens]
    period = len(tokens) - follows
    while len(drafts) < num_tokens:
        drafts.append(drafts[len(drafts) - period])
    return drafts


def _counted_on(earlier: list[int], later: list[int], vocab_size: int) -> list[int]:
    """`later` plus its difference from `earlier` where the two differ by 0 or 1 token id
    at every position and somewhere by 1; else `later`."""
    if len(earlier) != len(later):
        return later
    steps = [b - a for a, b in zip(earlier, later, strict=True)]
    if not any(steps) or any(abs(s) > 1 for s in steps):
        return later
    counted = [t + s for t, s in zip(later, steps, strict=True)]
    if not all(0 <= t < vocab_size for t in counted):
        return later
    return counted
