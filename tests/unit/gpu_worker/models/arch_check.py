"""How an architecture is proved: a tiny random-weight model built from transformers' own
config class, served by the engine in fp32, gives Hugging Face `generate`'s greedy tokens
(EOS ignored) in one continuous batch with chunked prefill, and again from a warm prefix
cache."""

from __future__ import annotations

import random
from pathlib import Path

from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import TINY_VOCAB_SIZE, build_tiny_model

PROMPT_LENGTHS = (1, 9, 31, 70, 150)
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def random_prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB_SIZE) for _ in range(n)] for n in lengths]


def make_engine(model_dir: Path, block_size: int = 4) -> LLMEngine:
    return LLMEngine(
        model_dir,
        # a 64-token budget splits the longer prompts into chunks over their cached prefix
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512),
        CacheConfig(block_size=block_size, num_blocks=512),
        dtype="float32",
        device="cpu",  # HF runs on the CPU too; the Triton kernels take no 4-token blocks
    )


def check_architecture(tmp_path: Path, arch: str, **overrides: object) -> None:
    model_dir = build_tiny_model(tmp_path / arch, arch, **overrides)
    hf = load_hf(model_dir)
    engine = make_engine(model_dir)

    prompts = random_prompts(PROMPT_LENGTHS, seed=0)
    results = engine.generate(prompts, GREEDY)
    # a model stuck on one token would prove little
    assert len({t for r in results for t in r.token_ids}) >= 8, [r.token_ids for r in results]
    for prompt, result in zip(prompts, results, strict=True):
        assert result.finish_reason == "length"
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, MAX_TOKENS), f"{arch}")

    prefix = random_prompts((40,), seed=1)[0]
    engine.generate([[*prefix, 5, 6, 7]], GREEDY)  # warms the prefix cache
    warm = [prefix + tail for tail in random_prompts((1, 12, 30), seed=2)]
    results = engine.generate(warm, GREEDY)
    assert all(r.num_cached_tokens >= 40 for r in results), [r.num_cached_tokens for r in results]
    for prompt, result in zip(warm, results, strict=True):
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, MAX_TOKENS), f"{arch} warm")


def check_generation_past(tmp_path: Path, arch: str, length: int, **overrides: object) -> None:
    """Prompts shorter than `length` whose greedy continuations run 60 tokens past it."""
    model_dir = build_tiny_model(tmp_path / arch, arch, **overrides)
    hf, engine = load_hf(model_dir), make_engine(model_dir)
    prompts = random_prompts((5, length // 2, length - 1), seed=3)
    greedy = SamplingParams(temperature=0.0, max_tokens=length + 60, ignore_eos=True)
    for prompt, result in zip(prompts, engine.generate(prompts, greedy), strict=True):
        ref = hf_greedy(hf, prompt, length + 60)
        assert_matches_hf(result.token_ids, ref, f"{arch}, {len(prompt)}-token prompt")
