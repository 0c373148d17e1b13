"""What the CPU fused forward's tests check in bf16 and in float32 alike
(`test_cpu_fused_forward.py`, `test_cpu_fused_forward_fp32.py`)."""

from __future__ import annotations

import torch

from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.shared.protocol import SamplingParams

BLOCK_SIZE = 16


def run_steps(forward_pass, caches, steps):
    """Each step's final hidden states, through the fused path or the modules."""
    return [forward_pass(t, p, caches, metadata) for t, p, metadata in steps]


def two_steps(vocab: int, first_prompt: int):
    """Step 1: two prompts (`first_prompt` and 9 tokens). Step 2: a 5-token chunk over the
    first's prompt, a decode of the second, and a third sequence's 4 rows (a token and 3
    drafts) over 30 cached tokens it never had written (attention reads whatever the cache
    holds)."""
    gen = torch.Generator().manual_seed(0)
    tables, cpu = [[0, 1], [2], [3, 4, 5]], torch.device("cpu")
    n = first_prompt
    first = (
        torch.randint(0, vocab, (n + 9,), generator=gen),
        torch.tensor([*range(n), *range(9)]),
        build_attention_metadata([n, 9], [n, 9], tables[:2], BLOCK_SIZE, cpu),
    )
    second = (
        torch.randint(0, vocab, (10,), generator=gen),
        torch.tensor([*range(n, n + 5), 9, *range(30, 34)]),
        build_attention_metadata([n + 5, 10, 34], [5, 1, 4], tables, BLOCK_SIZE, cpu),
    )
    return [first, second]


def assert_the_modules_bits(engine: LLMEngine, steps, dtype: torch.dtype) -> None:
    """`steps` through the engine's fused pass and through its model, from the same random
    caches: the same final hidden states, in `dtype`, and the same caches after."""
    caches = [(torch.randn_like(k), torch.randn_like(v)) for k, v in engine.runner.kv_caches]
    module_caches = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        ours = run_steps(engine.runner.forward_pass, caches, steps)
        theirs = run_steps(engine.runner.model, module_caches, steps)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == dtype and torch.equal(a, b)
    for (k, v), (mk, mv) in zip(caches, module_caches, strict=True):
        assert torch.equal(k, mk) and torch.equal(v, mv)


def assert_greedy_unchanged(engine: LLMEngine) -> None:
    """Three prompts' greedy tokens through the engine's fused pass and through its model."""
    fused = engine.runner.forward_pass
    texts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.reset_prefix_cache()
    with_fused = engine.generate(texts, greedy)
    engine.reset_prefix_cache()
    engine.runner.forward_pass = engine.runner.model
    try:
        without = engine.generate(texts, greedy)
    finally:
        engine.runner.forward_pass = fused
    assert [r.token_ids for r in with_fused] == [r.token_ids for r in without]
    assert "Paris" in with_fused[0].text


def assert_logit_rows_keep_their_bits(fused, caches, vocab: int = 49152) -> None:
    """Through `fused` with `logit_rows` (as the runner passes the rows it samples from, in
    any order): those rows are the bits of the full pass, every other row is zero where the
    pass takes the step (the modules' steps compute all rows), and the caches are the same
    bits (each row's keys and values are written in the last layer too). A step with no such
    rows (a chunk that does not end its prompt) gives zeros."""
    steps = two_steps(vocab, 20)
    full_caches = [(k.clone(), v.clone()) for k, v in caches]
    picks = [torch.tensor([28, 19]), torch.tensor([6, 4, 5, 7, 8, 9])]  # last rows, drafts
    with torch.inference_mode():
        for (tokens, positions, metadata), rows in zip(steps, picks, strict=True):
            full = fused(tokens, positions, full_caches, metadata)
            some = fused(tokens, positions, caches, metadata, logit_rows=rows)
            assert torch.equal(some[rows], full[rows])
            others = torch.ones(len(tokens), dtype=torch.bool)
            others[rows] = False
            assert not some[others].any() or not fused.takes_step(len(tokens), metadata)
        tokens, positions, metadata = steps[1]
        assert fused.takes_step(len(tokens), metadata)
        none = fused(
            tokens, positions, caches, metadata, logit_rows=torch.tensor([], dtype=torch.long)
        )
        assert none.shape == (len(tokens), full.shape[1]) and not none.any()
    for (k, v), (fk, fv) in zip(caches, full_caches, strict=True):
        assert torch.equal(k, fk) and torch.equal(v, fv)
