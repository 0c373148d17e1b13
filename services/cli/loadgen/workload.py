"""Benchmark workloads: a list of prompts with fixed output lengths, seeded and reproducible.

A synthetic workload draws prompt and output lengths from a lognormal distribution (the long
tail that real chat traffic has: most requests short, a few long), clipped to bounds, and fills
each prompt with random real words from the tokenizer's vocabulary, so the server tokenizes
ordinary text. Outputs are fixed-length (`ignore_eos` + `max_tokens`), so every system under
test produces exactly the same number of tokens. `text="prose"` fills the prompts with chat
requests about passages of real English instead (`prose.py`): random words make a model
repeat itself, which flatters n-gram speculation. A JSONL workload gives one request per line:
`{"prompt": str | [int], "output_len": int}` (`max_tokens` is accepted for `output_len`).
`with_fresh_words` copies a workload with new words or passages (same lengths), for runs that
must not hit a prefix cache that an earlier run on the same server filled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pagedserve.services.cli.loadgen.prose import ProsePrompts


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload; `prompt_token_ids` are exact, `prompt` is their text."""

    prompt: str
    prompt_token_ids: list[int]
    output_len: int
    # what fills the prompt: "words" (random), "prose" (prose.py), "given" (a file's); where
    # the prompt came from, not what it is, so it takes no part in equality
    text: str = field(default="words", compare=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class LengthDistribution:
    """Lognormal lengths with the given median, clipped to [min_len, max_len].

    `sigma` is the log-space standard deviation: 0 gives every request the median, 1 a long
    tail (p99 about 10x the median)."""

    median: int
    sigma: float
    min_len: int
    max_len: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.median <= self.max_len:
            raise ValueError(
                f"lengths need 1 <= min_len ({self.min_len}) <= median ({self.median}) "
                f"<= max_len ({self.max_len})"
            )
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")

    def sample(self, rng: np.random.Generator, num: int) -> list[int]:
        raw = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=num)
        return [int(x) for x in np.clip(np.rint(raw), self.min_len, self.max_len)]


def word_token_ids(tokenizer: Any) -> list[int]:
    """Vocabulary ids that decode to a space followed by letters only (" house", " the"), so
    that a run of them is plain text that re-tokenizes to the same ids."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if len(text) >= 3 and text[0] == " " and text[1:].isalpha() and text[1:].isascii():
            ids.append(token_id)
    if not ids:
        # Tiny test tokenizers may lack space-prefixed words: fall back to any alphabetic piece.
        ids = [
            i
            for i in range(len(tokenizer))
            if i not in special and tokenizer.decode([i]).strip().isalpha()
        ]
    if not ids:
        raise ValueError("the tokenizer has no word-like tokens to build prompts from")
    return ids


TEXTS = ("words", "prose")  # what a synthetic workload's prompts hold


def synthetic_workload(
    tokenizer: Any,
    num_requests: int,
    prompt_lens: LengthDistribution,
    output_lens: LengthDistribution,
    seed: int = 0,
    text: str = "words",
) -> list[BenchRequest]:
    """`num_requests` prompts of random words (or chat requests about prose), lengths from the
    two distributions."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if text not in TEXTS:
        raise ValueError(f"text must be one of {', '.join(TEXTS)}, got {text!r}")
    rng = np.random.default_rng(seed)
    prompt_len_list = prompt_lens.sample(rng, num_requests)
    output_len_list = output_lens.sample(rng, num_requests)
    shapes = [BenchRequest("", [0] * p, o, text) for p, o in zip(prompt_len_list, output_len_list,
                                                                   strict=True)]  # fmt: skip
    return _filled(shapes, tokenizer, rng)


def with_fresh_words(
    requests: Sequence[BenchRequest], tokenizer: Any, seed: int
) -> list[BenchRequest]:
    """The same requests with new random words: each prompt keeps its length in tokens and its
    output length, so the model does the same work, but the content is new, so that a server's
    prefix cache holds none of it from an earlier run (which would skip prefills that a
    baseline without a prefix cache computes). Give each fresh copy its own seed."""
    return _filled(requests, tokenizer, np.random.default_rng(seed))


def _filled(
    shapes: Sequence[BenchRequest], tokenizer: Any, rng: np.random.Generator
) -> list[BenchRequest]:
    """New prompts of each shape's length and text kind ("given" prompts become words)."""
    vocab = np.asarray(word_token_ids(tokenizer))
    prose = None
    requests = []
    for shape in shapes:
        if shape.text == "prose":
            prose = prose or ProsePrompts(tokenizer)
            prompt, token_ids = prose.prompt(rng, shape.prompt_len)
            requests.append(BenchRequest(prompt, token_ids, shape.output_len, "prose"))
        else:
            requests.append(
                _random_words_request(tokenizer, rng, vocab, shape.prompt_len, shape.output_len)
            )
    return requests


def _random_words_request(
    tokenizer: Any, rng: np.random.Generator, vocab: np.ndarray, prompt_len: int, output_len: int
) -> BenchRequest:
    token_ids = [int(t) for t in rng.choice(vocab, size=prompt_len)]
    return BenchRequest(tokenizer.decode(token_ids), token_ids, output_len)


def load_jsonl_workload(path: Path, tokenizer: Any, limit: int | None = None) -> list[BenchRequest]:
    """Requests from a JSONL file; a text prompt is tokenized to know its exact length."""
    requests = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompt = item["prompt"]
            output_len = int(item.get("output_len", item.get("max_tokens")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{line_no}: each line needs a JSON object with `prompt` and "
                f"`output_len` (or `max_tokens`): {exc}"
            ) from exc
        if output_len < 1:
            raise ValueError(f"{path}:{line_no}: output_len must be >= 1, got {output_len}")
        if isinstance(prompt, str):
            token_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        else:
            token_ids = [int(t) for t in prompt]
            prompt = tokenizer.decode(token_ids)
        if not token_ids:
            raise ValueError(f"{path}:{line_no}: empty prompt")
        requests.append(BenchRequest(prompt, token_ids, output_len, "given"))
        if limit is not None and len(requests) >= limit:
            break
    if not requests:
        raise ValueError(f"{path} holds no requests")
    return requests


def save_jsonl_workload(requests: Sequence[BenchRequest], path: Path) -> None:
    lines = [
        json.dumps({"prompt": r.prompt_token_ids, "output_len": r.output_len}) for r in requests
    ]
    Path(path).write_text("\n".join(lines) + "\n")


def poisson_arrival_times(num: int, request_rate: float, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of a Poisson process; inf: everything at 0."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be > 0 (inf for all at once), got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * num
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / request_rate, size=num)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]
