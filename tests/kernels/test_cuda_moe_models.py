"""On a CUDA GPU, the MoE architectures served by the engine in fp32 with their experts on
the fused-MoE kernel (its launches counted), the KV cache sized by the memory profile
(num_blocks left to it), against HF greedy on the CPU; chunked prefill with 16-token
blocks. `make device-check` runs tests/kernels with TRITON_INTERPRET=0 only for the oracle
files; run this one the same way. Skips under the interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pagedserve.kernels import fused_moe as fused_moe_kernel
from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.models.arch_check import GREEDY, MAX_TOKENS, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="tests the compiled kernels: run with TRITON_INTERPRET=0",
    ),
]


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_moe_model_on_cuda_matches_transformers(tmp_path: Path, arch: str, monkeypatch) -> None:
    launches: list[int] = []
    real = fused_moe_kernel.fused_experts
    monkeypatch.setattr(
        fused_moe_kernel, "fused_experts", lambda x, *a: launches.append(x.shape[0]) or real(x, *a)
    )
    model_dir = build_tiny_model(tmp_path / arch, arch, seed=1)
    engine = LLMEngine(
        model_dir, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512),
        CacheConfig(block_size=16, gpu_memory_utilization=0.05), dtype="float32",
        device="cuda", attention_backend="triton",
    )  # fmt: skip
    hf = load_hf(model_dir)
    prompts = random_prompts((5, 64, 170), seed=0)
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, MAX_TOKENS), f"{arch} cuda")
    assert len(launches) >= MAX_TOKENS, launches  # every decode step went through it
