"""Prose prompts: paragraphs of docstrings that read as English, chat prompts of the asked
length about them, and prose workloads that keep their kind when refreshed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedserve.services.cli.loadgen.prose import ProsePrompts, prose_paragraphs, stdlib_paragraphs
from pagedserve.services.cli.loadgen.workload import (
    LengthDistribution,
    synthetic_workload,
    with_fresh_words,
)

PROSE = "The lock is released when the block exits, so that another thread may take it in turn."
MODULE = f'''"""{PROSE}

>>> take_lock()
True

Short line.

    indented = code_sample(here, and, there)
"""
raise SystemExit("importing this file would stop the test")


def f():
    """Return the number of items the queue holds right now, which may be stale soon after."""
'''


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from pagedserve.services.gpu_worker.default_model import ensure_model

    return AutoTokenizer.from_pretrained(ensure_model("smollm2"))


def test_only_prose_paragraphs_are_kept() -> None:
    assert prose_paragraphs(MODULE.split('"""')[1]) == [PROSE]
    for not_prose in (
        "- a list item that has enough words to count as a sentence here",
        "Uses os_path_join to build every path the function returns to you.",
        "Die Sperre wird freigegeben, sobald der Block endet, damit ein anderer sie nimmt: ü.",
    ):
        assert prose_paragraphs(not_prose) == []


def test_paragraphs_are_read_from_source_without_importing_it(tmp_path: Path) -> None:
    (tmp_path / "locks.py").write_text(MODULE)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_locks.py").write_text(f'"""{PROSE} Tests are left out."""')
    (tmp_path / "broken.py").write_text("def (:")
    assert stdlib_paragraphs(str(tmp_path)) == (
        PROSE,
        "Return the number of items the queue holds right now, which may be stale soon after.",
    )


def test_the_standard_library_gives_plenty_of_prose() -> None:
    paragraphs = stdlib_paragraphs()
    assert len(paragraphs) > 500
    assert all(p.isascii() and len(p.split()) >= 12 for p in paragraphs)


def test_prompts_are_chat_requests_of_the_asked_length(tokenizer) -> None:
    prompts = ProsePrompts(tokenizer)
    rng = np.random.default_rng(0)
    lengths = [120, 200, 318, 77, 500]
    made = [prompts.prompt(rng, n) for n in lengths]
    for (text, ids), n in zip(made, lengths, strict=True):
        assert ids == list(tokenizer.encode(text, add_special_tokens=False))
        assert abs(len(ids) - n) <= 1, (len(ids), n)
        assert text.endswith("<|im_start|>assistant\n")
        assert "<|im_start|>user\n" in text
    # Too short for the template: the instruction and a few words of prose, no less.
    text, ids = prompts.prompt(rng, 10)
    assert 40 <= len(ids) <= 70 and text.endswith("<|im_start|>assistant\n")


def test_a_tokenizer_without_a_chat_template_or_no_prose_is_a_clear_error(tokenizer) -> None:
    from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer

    lengths = LengthDistribution(10, 0.0, 10, 10)
    with pytest.raises(ValueError, match="no chat template"):
        synthetic_workload(FakeTokenizer(), 2, lengths, lengths, text="prose")
    with pytest.raises(ValueError, match="no prose paragraphs"):
        ProsePrompts(tokenizer, [])


def test_a_prose_workload_stays_prose_when_refreshed(tokenizer) -> None:
    prompt_lens = LengthDistribution(100, 0.5, 60, 300)
    output_lens = LengthDistribution(20, 0.5, 4, 60)
    requests = synthetic_workload(tokenizer, 12, prompt_lens, output_lens, seed=3, text="prose")
    words = synthetic_workload(tokenizer, 12, prompt_lens, output_lens, seed=3)
    assert [r.output_len for r in requests] == [r.output_len for r in words]
    assert all(r.text == "prose" and "<|im_start|>" in r.prompt for r in requests)
    fresh = with_fresh_words(requests, tokenizer, seed=4)
    assert all(r.text == "prose" for r in fresh)
    assert [r.output_len for r in fresh] == [r.output_len for r in requests]
    assert all(abs(a.prompt_len - b.prompt_len) <= 1 for a, b in zip(fresh, requests, strict=True))
    assert all(a.prompt != b.prompt for a, b in zip(fresh, requests, strict=True))
    assert synthetic_workload(tokenizer, 12, prompt_lens, output_lens, 3, "prose") == requests
    with pytest.raises(ValueError, match="text must be one of"):
        synthetic_workload(tokenizer, 2, prompt_lens, output_lens, text="poetry")
