"""Mixture-of-experts models at TP=2 over gloo (see `test_tensor_parallel.py`): each rank
holds every expert's half of the intermediate features, and the routed experts' partial
sums meet in one all-reduce per layer (Qwen2-MoE's shared expert reduces its own; GPT-OSS's
down bias is added on rank 0 only, and each rank holds its heads' attention sinks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.test_tensor_parallel import check_tp2_matches_hf


@pytest.mark.slow
def test_moe_models_at_tp2_over_gloo_match_hf(tmp_path: Path) -> None:
    model_dirs = [
        build_tiny_model(tmp_path / arch, arch, seed=5)
        for arch in ("mixtral", "qwen3_moe", "qwen2_moe", "gpt_oss")
    ]
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf(model_dirs, prompts)


@pytest.mark.slow
def test_deepseek_at_tp2_over_gloo_matches_hf(tmp_path: Path) -> None:
    """MLA at TP=2: each rank holds half the heads of q_b_proj/q_proj, kv_b_proj and o_proj,
    and the whole latent cache; the shared experts reduce on their own."""
    model_dirs = [
        build_tiny_model(tmp_path / arch, arch, seed=6) for arch in ("deepseek_v2", "deepseek_v3")
    ]
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf(model_dirs, prompts)
