"""A word-level tokenizer small enough to reason about: id i decodes to WORDS[i]."""

from __future__ import annotations

WORDS = ["<pad>", "<eos>", " the", " cat", "sat", " on", "!", " mat", " 42", " dog", " é"]


class FakeTokenizer:
    all_special_ids = [0, 1]

    def __len__(self) -> int:
        return len(WORDS)

    def decode(self, token_ids: list[int]) -> str:
        return "".join(WORDS[i] for i in token_ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [WORDS.index(" " + word) for word in text.split()]
