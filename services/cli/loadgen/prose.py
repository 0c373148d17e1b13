"""Prompts of real English for benchmarks: chat requests about passages of prose.

A synthetic workload of random words (`workload.py`) makes a model continue nonsense, and a
small model's greedy continuation of nonsense soon repeats itself, so n-gram speculation (a
draft copied from the text so far) is accepted far more often than in real traffic. These
prompts are what a chat user sends instead: an instruction (summarize, answer, explain,
rewrite, continue) about a passage of real prose, rendered with the model's own chat template
into completion text, so that every server gets the same tokens through `/v1/completions`.

The prose is the English of the Python standard library's docstrings, read from its source
files with `ast` (nothing imported, nothing downloaded): paragraphs of plain sentences, with
code, doctests, tables and lists left out. It is the same on every machine with the same
Python version, and a seed picks the passages.
"""

from __future__ import annotations

import ast
import functools
import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

INSTRUCTIONS = (
    "Summarize the following text in a few sentences.",
    "Explain the following text to a beginner, in your own words.",
    "What are the main points of the following text?",
    "Rewrite the following text so that it is easier to read.",
    "Write a short story inspired by the following text.",
    "Answer: what problem does the following text describe, and how is it solved?",
    "Write a few questions a student could ask about the following text.",
    "Continue the following text with a paragraph of your own.",
)
MIN_PARAGRAPH_WORDS = 12
MAX_LENGTH_TRIES = 8


@functools.cache
def stdlib_paragraphs(root: str | None = None) -> tuple[str, ...]:
    """Every prose paragraph of the docstrings under `root` (the standard library), in file
    order: one line each, whitespace collapsed."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    paragraphs: list[str] = []
    for path in sorted(base.rglob("*.py")):
        if any(part in ("test", "tests", "idlelib", "site-packages") for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                paragraphs.extend(prose_paragraphs(ast.get_docstring(node) or ""))
    return tuple(paragraphs)


def prose_paragraphs(docstring: str) -> list[str]:
    """The paragraphs of `docstring` that read as prose: enough words, mostly letters, no
    code, doctest, list or table lines."""
    kept = []
    for block in re.split(r"\n\s*\n", docstring):
        lines = block.splitlines()
        if not lines or any(_looks_like_code(line) for line in lines):
            continue
        text = " ".join(line.strip() for line in lines)
        words = text.split()
        letters = sum(c.isalpha() or c.isspace() for c in text)
        if len(words) >= MIN_PARAGRAPH_WORDS and text.isascii() and letters >= 0.9 * len(text):
            kept.append(text)
    return kept


def _looks_like_code(line: str) -> bool:
    stripped = line.strip()
    return (
        line.startswith((" " * 4, "\t"))
        or stripped.startswith((">>>", "...", "-", "*", "+", "|", "=", ":", "#", "$"))
        or "::" in stripped
        or "()" in stripped
        or "_" in stripped
    )


class ProsePrompts:
    """Chat prompts about prose passages, rendered with `tokenizer`'s chat template, of an
    exact length in tokens where the template allows it."""

    def __init__(self, tokenizer: Any, paragraphs: Sequence[str] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "prose prompts are chat requests: the tokenizer has no chat template to render "
                "them with (use prompts of random words, or a model with a chat template)"
            )
        self.tokenizer = tokenizer
        self.paragraphs = list(paragraphs if paragraphs is not None else stdlib_paragraphs())
        if not self.paragraphs:
            raise ValueError("no prose paragraphs to build prompts from")

    def render(self, instruction: str, passage: str) -> str:
        messages = [{"role": "user", "content": f"{instruction}\n\n{passage}"}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, rng: np.random.Generator, length: int) -> tuple[str, list[int]]:
        """A prompt of `length` tokens (or the nearest the template and the prose allow: at
        least the instruction and a few words), from a random instruction and the paragraphs
        that follow a random one."""
        instruction = INSTRUCTIONS[int(rng.integers(len(INSTRUCTIONS)))]
        start = int(rng.integers(len(self.paragraphs)))
        passage_ids = self._passage_ids(start, length)
        overhead = len(self.encode(self.render(instruction, ""))) + 1
        budget = max(length - overhead, 4)
        best: tuple[str, list[int]] | None = None
        tried: set[int] = set()
        for _ in range(MAX_LENGTH_TRIES):
            tried.add(budget)
            text = self.render(instruction, self.tokenizer.decode(passage_ids[:budget]).strip())
            ids = self.encode(text)
            if best is None or abs(len(ids) - length) < abs(len(best[1]) - length):
                best = (text, ids)
            miss = length - len(ids)
            if miss == 0 or budget >= len(passage_ids):
                break
            # Token merges at the cut can move the count by more than the budget: step past
            # budgets already tried rather than oscillate between two of them.
            step = miss if budget + miss not in tried else (1 if miss > 0 else -1)
            while budget + step in tried:
                step += 1 if miss > 0 else -1
            budget = max(budget + step, 4)
            if budget in tried:
                break
        assert best is not None
        return best

    def _passage_ids(self, start: int, length: int) -> list[int]:
        """Token ids of the paragraphs from `start` on (wrapping), at least `length` of them."""
        ids: list[int] = []
        i = start
        while len(ids) < length + 8:
            ids.extend(self.encode(self.paragraphs[i % len(self.paragraphs)] + "\n\n"))
            i += 1
            if i - start > len(self.paragraphs):
                break
        return ids
