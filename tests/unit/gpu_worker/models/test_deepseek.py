"""DeepSeek-V2/V3 beyond the token checks of `test_moe_architectures.py`: the latent KV
cache's size (what the worker allocates and how many blocks its budget holds), V3 with
rotate-half rope, and the config features that are refused by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import DeepseekV2Config, DeepseekV3Config

from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.model_loader import load_model
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.models.deepseek_v2 import (
    DeepseekV2ForCausalLM,
    DeepseekV3ForCausalLM,
)
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.kv_cache_spec import KVCacheSpec
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import ARCH_OVERRIDES, build_tiny_model, tiny_config_kwargs
from tests.unit.gpu_worker.models.arch_check import (
    GREEDY,
    MAX_TOKENS,
    PROMPT_LENGTHS,
    check_architecture,
    random_prompts,
)

LATENT, ROPE = 32, 8  # the tiny configs' kv_lora_rank and qk_rope_head_dim


def test_latent_layout_sizes_blocks_by_the_latent_row() -> None:
    latent = [KVCacheSpec(latent_dim=LATENT, latent_rope_dim=ROPE)] * 3
    layout = KVCacheLayout.from_specs(latent, 4, num_kv_heads=4, head_dim=24, dtype=torch.float32)
    assert (layout.num_kv_heads, layout.head_dim, layout.latent) == (1, LATENT + ROPE, True)
    assert layout.block_bytes() == 3 * 4 * (LATENT + ROPE) * 4
    per_head = KVCacheLayout.from_specs([KVCacheSpec()] * 3, 4, 4, 24, torch.float32)
    assert per_head.block_bytes() == 3 * 4 * 2 * 4 * 24 * 4
    key, value = layout.allocate(5, torch.device("cpu"))[0]
    assert key is value and key.shape == (5, 4, 1, LATENT + ROPE)


def test_layouts_refuse_mixed_or_unequal_latent_layers() -> None:
    with pytest.raises(ValueError, match="mixing latent and per-head"):
        KVCacheLayout.from_specs([KVCacheSpec(), KVCacheSpec(latent_dim=8)], 4, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="different widths"):
        KVCacheLayout.from_specs(
            [KVCacheSpec(latent_dim=8), KVCacheSpec(latent_dim=16)], 4, 1, 8, torch.float32
        )


def test_worker_sizes_the_cache_from_the_latent_spec(tmp_path: Path) -> None:
    """A CPU budget of exactly 10 latent blocks gives 10 blocks, of one tensor per layer; at
    2 x heads x qk_head_dim a token it would hold fewer than 3."""
    model_dir = build_tiny_model(tmp_path / "v2", "deepseek_v2")
    block_bytes = 3 * 4 * (LATENT + ROPE) * 4  # layers x block x latent row x fp32
    runner = ModelRunner(
        model_dir, CacheConfig(block_size=4, kv_cache_memory=10 * block_bytes), dtype="float32",
        device="cpu", show_progress=False,
    )  # fmt: skip
    assert runner.num_blocks == 10
    assert runner.model.kv_cache_specs()[0] == KVCacheSpec(latent_dim=LATENT, latent_rope_dim=ROPE)
    for key, value in runner.kv_caches:
        assert key is value and key.shape == (10, 4, 1, LATENT + ROPE)


def test_v3_with_rotate_half_rope_matches_transformers(tmp_path: Path) -> None:
    check_architecture(tmp_path, "deepseek_v3", rope_interleave=False)


def config(cls: type, **fields: object):
    """A tiny config with `fields` set after validation (HF's config classes check types)."""
    cfg = cls(**tiny_config_kwargs(**ARCH_OVERRIDES[cls.model_type]))
    for name, value in fields.items():
        object.__setattr__(cfg, name, value)
    return cfg


V2, V3 = (DeepseekV2ForCausalLM, DeepseekV2Config), (DeepseekV3ForCausalLM, DeepseekV3Config)


@pytest.mark.parametrize(
    ("model", "fields", "named"),
    [
        (V2, {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
        (V3, {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
        (V2, {"n_routed_experts": None}, "n_routed_experts None"),
        (V3, {"n_group": 3}, "n_group=3"),
        (V3, {"quantization_config": {"quant_method": "fp8"}}, "quant_method 'fp8'"),
        (V3, {"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "type 'mrope'"),
    ],
)
def test_unsupported_features_are_refused_by_name(model, fields, named) -> None:
    model_cls, config_cls = model
    with pytest.raises(ValueError, match=named):
        model_cls(config(config_cls, **fields), TorchAttentionBackend)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="the compiled kernels: TRITON_INTERPRET=0"
)
@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_deepseek_on_cuda_through_triton_matches_transformers(tmp_path: Path, arch: str) -> None:
    """The engine on CUDA in fp32 with the triton backend chosen (MLA attends through the
    torch one; the warm-up must not launch the Triton kernels in its geometry), 16-token
    blocks, chunked prefill, against HF greedy on the CPU."""
    model_dir = build_tiny_model(tmp_path / arch, arch)
    engine = LLMEngine(
        model_dir, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512),
        CacheConfig(block_size=16, num_blocks=256), dtype="float32", device="cuda",
        attention_backend="triton",
    )  # fmt: skip
    hf = load_hf(model_dir)
    prompts = random_prompts(PROMPT_LENGTHS, seed=0)
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, MAX_TOKENS), f"{arch} cuda")


def test_dense_and_expert_layers_follow_first_k_dense_replace_and_moe_layer_freq() -> None:
    """DeepSeek's rule: experts from layer first_k_dense_replace on, where index % freq == 0."""
    cfg = config(DeepseekV2Config, num_hidden_layers=6, first_k_dense_replace=1)
    object.__setattr__(cfg, "moe_layer_freq", 2)
    model = DeepseekV2ForCausalLM(cfg, TorchAttentionBackend)
    kinds = [type(layer.mlp).__name__ for layer in model.layers]
    assert kinds == ["GatedMLP", "GatedMLP", "FusedMoE", "GatedMLP", "FusedMoE", "GatedMLP"]


def test_v3_router_bias_loads_in_float32_under_a_bf16_model(tmp_path: Path) -> None:
    """The correction bias steers the choice by small differences: it keeps the checkpoint's
    float32 values when the model is loaded in bf16."""
    from safetensors import safe_open

    model_dir = build_tiny_model(tmp_path / "v3", "deepseek_v3")
    model = load_model(model_dir, TorchAttentionBackend, torch.bfloat16, torch.device("cpu"),
                       show_progress=False)  # fmt: skip
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        stored = f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias")
    bias = model.layers[1].mlp.e_score_correction_bias
    assert bias.dtype == torch.float32 and stored.dtype == torch.float32
    assert torch.equal(bias, stored)
    assert model.layers[1].mlp.gate.weight.dtype == torch.bfloat16
