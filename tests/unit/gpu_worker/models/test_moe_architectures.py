"""Mixture-of-experts architectures against transformers (see `arch_check.py`): the shared
check (chunked prefill, a warm prefix cache), then four prompts of 5 to 300 tokens in one
batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.models.arch_check import (
    GREEDY,
    MAX_TOKENS,
    check_architecture,
    make_engine,
    random_prompts,
)

LONG_PROMPT_LENGTHS = (5, 64, 170, 300)


def check_long_prompts(tmp_path: Path, arch: str) -> None:
    model_dir = build_tiny_model(tmp_path / f"{arch}-long", arch, seed=1)
    hf, engine = load_hf(model_dir), make_engine(model_dir)
    prompts = random_prompts(LONG_PROMPT_LENGTHS, seed=4)
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.finish_reason == "length"
        ref = hf_greedy(hf, prompt, MAX_TOKENS)
        assert_matches_hf(result.token_ids, ref, f"{arch}, {len(prompt)}-token prompt")


@pytest.mark.parametrize(
    "arch", ["mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3"]
)
def test_moe_architecture_matches_transformers(tmp_path, arch):
    check_architecture(tmp_path, arch)
    check_long_prompts(tmp_path, arch)
