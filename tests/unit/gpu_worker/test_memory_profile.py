"""The CUDA memory profile reserves a MoE model's expert activations at the largest step:
`CudaPlatform.num_kv_blocks` runs here on the CPU (the worst step is real; torch.cuda's
meters are stubbed to report a peak of the weights alone, as a profile that saw no
activations would), and the KV budget shrinks by the bytes worked out by hand below."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.layers.fused_moe import ExpertsOp, FusedMoE
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.platforms.base import KVSizing
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from pagedserve.services.gpu_worker.platforms.memory_profile import (
    moe_activation_bytes,
    parameter_bytes,
)
from pagedserve.shared.config import CacheConfig
from tests.fixtures.tiny_models import build_tiny_model

TOTAL = 1 << 30  # the fake device's memory
TOKENS = 200  # the token budget: a step the profile sizes for
# tiny qwen2_moe (tests/fixtures/tiny_models.py): hidden 64, 4 experts, top 2, experts'
# intermediate 48, shared expert 96
H, E, K, I, S = 64, 4, 2, 48, 96


def expected_moe_bytes(kernel: bool) -> int:
    """A Qwen2-MoE layer's activations at TOKENS in fp32, from its shapes."""
    routing = TOKENS * (E * (4 + 8) + K * (8 + 4 + 4))  # logits, scores, choice; ids, weights
    shared = TOKENS * 3 * S * 4  # the shared expert's gate/up and activation
    pairs = TOKENS * K
    if kernel:  # hidden [pairs, I], weighted rows [pairs, H], the sum [T, H], int32 indices
        block_m = 64  # 100 pairs per expert on average: the widest block
        padded = -(-(pairs + E * (block_m - 1)) // block_m) * block_m
        experts = 4 * (pairs * (I + H) + TOKENS * H) + 4 * (padded + padded // block_m) + 8
    else:  # three [pairs, H] row sets, the sum, one expert's gate/up + activation, the sort
        experts = 4 * (3 * pairs * H + TOKENS * (H + 3 * I)) + 16 * pairs
    return routing + shared + experts


@pytest.fixture(scope="module")
def moe_runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("qwen2-moe"), "qwen2_moe", seed=3)
    return ModelRunner(
        str(model_dir), CacheConfig(block_size=16, num_blocks=4), dtype="float32",
        device="cpu", show_progress=False,
    )  # fmt: skip


def stub_cuda_meters(monkeypatch: pytest.MonkeyPatch, peak: int) -> None:
    for name in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: peak)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(total_memory=TOTAL)
    )


def kv_blocks(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, weights_peak: int) -> int:
    layout = KVCacheLayout(runner.model.num_layers, 16, runner.model.num_kv_heads,
                           runner.model.head_dim, torch.float32)  # fmt: skip
    throwaway = layout.block_bytes() * -(-TOKENS // 16)  # the profile's own cache
    stub_cuda_meters(monkeypatch, weights_peak + throwaway)
    sizing = KVSizing(runner.model, layout, CacheConfig(gpu_memory_utilization=0.5),
                      TOKENS, 4, 1024)  # fmt: skip
    return CudaPlatform(torch.device("cpu")).num_kv_blocks(sizing)


@pytest.mark.parametrize("kernel", [False, True])
def test_the_kv_budget_shrinks_by_the_experts_activations(moe_runner, monkeypatch, kernel):
    model = moe_runner.model
    for layer in (m for m in model.modules() if isinstance(m, FusedMoE)):
        layer.compute_experts = ExpertsOp(form="cuda" if kernel else "native")
        layer.experts.linear_methods.clear()  # the CPU platform's packing: not on CUDA
    weights = parameter_bytes(model)
    assert moe_activation_bytes(model, TOKENS) == expected_moe_bytes(kernel)
    block = KVCacheLayout(model.num_layers, 16, model.num_kv_heads, model.head_dim,
                          torch.float32).block_bytes()  # fmt: skip
    blocks = kv_blocks(moe_runner, monkeypatch, weights_peak=weights)
    assert blocks == (TOTAL // 2 - weights - expected_moe_bytes(kernel)) // block
    # a measured peak above the floor is the peak: the floor adds nothing then
    measured = weights + 2 * expected_moe_bytes(kernel)
    assert (
        kv_blocks(moe_runner, monkeypatch, weights_peak=measured)
        == (TOTAL // 2 - measured) // block
    )


def test_a_dense_model_reserves_no_expert_activations(tiny_llama_dir: Path, monkeypatch):
    runner = ModelRunner(str(tiny_llama_dir), CacheConfig(block_size=16, num_blocks=4),
                         dtype="float32", device="cpu", show_progress=False)  # fmt: skip
    model = runner.model
    assert moe_activation_bytes(model, TOKENS) == 0
    block = KVCacheLayout(model.num_layers, 16, model.num_kv_heads, model.head_dim,
                          torch.float32).block_bytes()  # fmt: skip
    weights = parameter_bytes(model)
    assert kv_blocks(runner, monkeypatch, weights) == (TOTAL // 2 - weights) // block
