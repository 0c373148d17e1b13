from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pagedserve.services.cli.loadgen.workload import (
    LengthDistribution,
    load_jsonl_workload,
    poisson_arrival_times,
    save_jsonl_workload,
    synthetic_workload,
    with_fresh_words,
    word_token_ids,
)
from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer

PROMPTS = LengthDistribution(median=20, sigma=1.0, min_len=4, max_len=60)
OUTPUTS = LengthDistribution(median=8, sigma=0.8, min_len=2, max_len=30)


def test_word_tokens_are_space_prefixed_letters_only() -> None:
    # " 42" (digits), "sat" (no space), "!" and " é" (not ascii) and specials are left out.
    assert word_token_ids(FakeTokenizer()) == [2, 3, 5, 7, 9]


def test_synthetic_workload_is_seeded_and_in_bounds() -> None:
    a = synthetic_workload(FakeTokenizer(), 200, PROMPTS, OUTPUTS, seed=7)
    b = synthetic_workload(FakeTokenizer(), 200, PROMPTS, OUTPUTS, seed=7)
    c = synthetic_workload(FakeTokenizer(), 200, PROMPTS, OUTPUTS, seed=8)
    assert a == b
    assert a != c
    assert all(4 <= r.prompt_len <= 60 and 2 <= r.output_len <= 30 for r in a)
    assert all(set(r.prompt_token_ids) <= {2, 3, 5, 7, 9} for r in a)
    # The text is the ids' decoding, and re-encodes to the same ids.
    assert all(FakeTokenizer().encode(r.prompt) == r.prompt_token_ids for r in a)


def test_fresh_words_keep_the_lengths_and_change_the_content() -> None:
    requests = synthetic_workload(FakeTokenizer(), 50, PROMPTS, OUTPUTS, seed=7)
    fresh = with_fresh_words(requests, FakeTokenizer(), seed=8)
    assert [(r.prompt_len, r.output_len) for r in fresh] == [
        (r.prompt_len, r.output_len) for r in requests
    ]
    # Five words and prompts of >= 4 tokens: a first block in common is rare, never all of them.
    same_start = [
        a.prompt_token_ids[:4] == b.prompt_token_ids[:4]
        for a, b in zip(requests, fresh, strict=True)
    ]
    assert sum(same_start) <= 2, same_start
    assert all(set(r.prompt_token_ids) <= {2, 3, 5, 7, 9} for r in fresh)
    assert all(FakeTokenizer().encode(r.prompt) == r.prompt_token_ids for r in fresh)
    assert with_fresh_words(requests, FakeTokenizer(), seed=8) == fresh  # seeded
    assert with_fresh_words(requests, FakeTokenizer(), seed=9) != fresh


def test_lengths_are_long_tailed_around_the_median() -> None:
    lengths = LengthDistribution(100, 1.0, 1, 10_000).sample(np.random.default_rng(0), 5000)
    assert 90 <= np.median(lengths) <= 110
    assert np.percentile(lengths, 99) > 5 * np.median(lengths)  # the long tail
    assert LengthDistribution(50, 0.0, 1, 100).sample(np.random.default_rng(0), 10) == [50] * 10


@pytest.mark.parametrize(
    ("args", "message"),
    [((5, 1.0, 6, 10), "min_len"), ((5, 1.0, 1, 4), "max_len"), ((5, -1.0, 1, 10), "sigma")],
)
def test_bad_length_distribution_is_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LengthDistribution(*args)


def test_jsonl_roundtrip_and_errors(tmp_path) -> None:
    requests = synthetic_workload(FakeTokenizer(), 5, PROMPTS, OUTPUTS, seed=1)
    path = tmp_path / "w.jsonl"
    save_jsonl_workload(requests, path)
    assert load_jsonl_workload(path, FakeTokenizer()) == requests
    assert len(load_jsonl_workload(path, FakeTokenizer(), limit=2)) == 2
    text = tmp_path / "t.jsonl"
    text.write_text('{"prompt": "the cat", "max_tokens": 3}\n')
    [req] = load_jsonl_workload(text, FakeTokenizer())
    assert (req.prompt_token_ids, req.output_len) == ([2, 3], 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "the"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: .*output_len"):
        load_jsonl_workload(bad, FakeTokenizer())
    bad.write_text('{"prompt": "the", "output_len": 0}\n')
    with pytest.raises(ValueError, match="output_len must be >= 1"):
        load_jsonl_workload(bad, FakeTokenizer())


def test_poisson_arrivals() -> None:
    assert poisson_arrival_times(4, math.inf) == [0.0] * 4
    times = poisson_arrival_times(4000, 20.0, seed=3)
    assert times == poisson_arrival_times(4000, 20.0, seed=3)
    assert times[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(times))
    assert 18 < len(times) / times[-1] < 22  # the mean rate
    with pytest.raises(ValueError, match="request_rate"):
        poisson_arrival_times(3, 0.0)
