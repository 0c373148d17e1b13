"""A lower bound on a text's token count, for free: no token of the vocabulary is longer than
`max_bytes_per_token` bytes, and a character is at least one byte, so a text of C characters
holds at least ceil(C / max_bytes_per_token) tokens.

Characters the tokenizer drops altogether are not counted: SmolLM2's drops six control
characters (U+0004, U+0006, U+0013, U+0014, U+0016, U+001D), found at load by encoding every
control and format character (`vanishing_chars`).

The bound only holds when the tokenizer's normalizer never shortens text (one that strips or
collapses whitespace does): for such a tokenizer `max_bytes_per_token` is None and no size
check is made (tokenizing stays bounded by the body size and the tokenizer pool).
"""

from __future__ import annotations

import json
import logging
import sys
import unicodedata
from typing import Any

logger = logging.getLogger(__name__)

# Normalizers that never make text shorter, so the per-token bound stays a lower bound.
_LENGTH_KEEPING_NORMALIZERS = {"Prepend", "Sequence", "Replace", "NFC", "NFKC"}
_NORMALIZED_GROWTH = 3  # NFC/NFKC composition: at most 3 characters become 1 (Hangul)


def max_bytes_per_token(tokenizer: Any) -> int | None:
    """The longest token's length in bytes (an upper bound), or None when the tokenizer can
    shorten text before splitting it (then no size bound is safe)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    normalizer_types = _types_in(spec.get("normalizer"))
    if not normalizer_types <= _LENGTH_KEEPING_NORMALIZERS or _shrinking_replace(
        spec.get("normalizer")
    ):
        logger.info("no prompt size bound: the normalizer %s may shorten text", normalizer_types)
        return None
    byte_level = "ByteLevel" in _types_in(spec.get("pre_tokenizer"))
    added = {t["content"] for t in spec.get("added_tokens", [])}
    longest = 1
    for token in tokenizer.get_vocab():
        # A byte-level token spells each byte as one character; other tokens are text.
        size = len(token) if byte_level and token not in added else len(token.encode("utf-8"))
        longest = max(longest, size)
    if {"NFC", "NFKC"} & normalizer_types:
        longest *= _NORMALIZED_GROWTH
    return longest


def _types_in(component: Any) -> set[str]:
    """Every `type` named in a tokenizer.json component, nested sequences included."""
    if isinstance(component, dict):
        found = {component["type"]} if isinstance(component.get("type"), str) else set()
        for value in component.values():
            found |= _types_in(value)
        return found
    if isinstance(component, list):
        return set().union(*(_types_in(item) for item in component)) if component else set()
    return set()


def _shrinking_replace(component: Any) -> bool:
    """A Replace normalizer whose replacement is shorter than what it replaces (or a regex)."""
    if isinstance(component, list):
        return any(_shrinking_replace(item) for item in component)
    if not isinstance(component, dict):
        return False
    if component.get("type") == "Replace":
        pattern = component.get("pattern", {})
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        content = component.get("content", "")
        return literal is None or len(content) < len(literal)
    return any(_shrinking_replace(v) for v in component.values() if isinstance(v, dict | list))


def min_num_tokens(text: str, bytes_per_token: int, vanishing: str = "") -> int:
    """At least this many tokens encode `text`; characters in `vanishing` (those the tokenizer
    drops, `vanishing_chars`) are not counted."""
    num_counted = len(text) - sum(text.count(c) for c in vanishing)
    return -(-num_counted // bytes_per_token)


def vanishing_chars(tokenizer: Any) -> str:
    """The control and format characters (Unicode Cc and Cf) that `tokenizer` drops: a run of
    them encodes to no token at all. Other characters each leave at least one byte in some
    token."""
    candidates = (chr(c) for c in range(sys.maxunicode + 1))
    controls = [c for c in candidates if unicodedata.category(c) in ("Cc", "Cf")]
    return "".join(c for c in controls if not tokenizer.encode(c * 3, add_special_tokens=False))
