"""Incremental detokenization: text for new token ids without ever emitting half a character.

Byte-level BPE splits multi-byte characters across tokens, so decoding one token at a time
yields U+FFFD. Like vLLM we keep two offsets into the ids: `prefix_offset` (start of a short
window decoded for context, since decoding is not a per-token concatenation) and `read_offset`
(end of what was already emitted). New text is `decode(window + new) - decode(window)`, held back
while it ends in U+FFFD (an incomplete character). `finish()` emits whatever remains, but for the
bytes of a character the output never completed.

A fast (Rust-backed) tokenizer whose decode adds nothing in Python is called directly: the
Python wrapper costs ~10x the decode itself, twice per streamed token, on cores the model uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class IncrementalDetokenizer:
    tokenizer: Any
    token_ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    emitted_text: str = ""
    skip_special_tokens: bool = True  # vLLM's parameter: False shows e.g. <|im_end|>
    decode: Callable[..., str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.decode = direct_decode(self.tokenizer)

    def _decode(self, ids: list[int]) -> str:
        return self.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int]) -> str:
        """Append ids; return the text they complete (possibly empty)."""
        self.token_ids.extend(new_token_ids)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset :])
        if full_text.endswith(REPLACEMENT_CHAR):
            return ""  # an incomplete character: wait for the rest of its bytes
        if len(full_text) <= len(prefix_text):
            # Only tokens without text (special ones): move on, or the window would grow.
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            return ""
        new_text = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.emitted_text += new_text
        return new_text

    def finish(self) -> str:
        """The text not emitted yet (a trailing invalid byte sequence, if any)."""
        full_text = self._decode(self.token_ids)
        if full_text.startswith(self.emitted_text):
            rest = full_text[len(self.emitted_text) :]
        else:  # a tokenizer whose decode is not prefix-stable: never lose text
            rest = ""
        # an output that ends inside a multi-byte character keeps those bytes back (as vLLM):
        # they decode to U+FFFD, which the model never wrote
        rest = rest.rstrip(REPLACEMENT_CHAR)
        self.emitted_text += rest
        return rest


def direct_decode(tokenizer: Any) -> Callable[..., str]:
    """`decode(ids, skip_special_tokens=...)` of `tokenizer`: its Rust backend's own when the
    Python layer would return the same text (its decode methods are the stock ones and it
    cleans up no spaces), else the tokenizer's."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode
    from transformers import PreTrainedTokenizerFast

    stock = PreTrainedTokenizerFast
    cls = type(tokenizer)
    overridden = (cls.decode, cls._decode) != (stock.decode, stock._decode)
    if not isinstance(tokenizer, stock) or overridden:
        return tokenizer.decode
    return backend.decode
