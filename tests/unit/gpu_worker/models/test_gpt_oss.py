"""GPT-OSS against transformers (see `arch_check.py`): attention sinks, alternating sliding
(24 keys) and full layers with prompts up to 300 tokens, q/k/v/o biases, a biased router and
biased experts with the clamped SwiGLU (a limit low enough to clamp), yarn RoPE; and its
checkpoint: interleaved gate/up columns split into their halves, MXFP4 refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.services.gpu_worker.models.gpt_oss import (
    gpt_oss_moe,
    load_stacked_biases,
    load_stacked_weights,
)
from tests.fixtures.tiny_models import ARCH_OVERRIDES, build_tiny_model, tiny_config_kwargs
from tests.unit.gpu_worker.models.arch_check import check_architecture
from tests.unit.gpu_worker.models.test_moe_architectures import check_long_prompts
from tests.unit.gpu_worker.test_model_loader import load


def test_gpt_oss_matches_transformers(tmp_path: Path) -> None:
    check_architecture(tmp_path, "gpt_oss")
    check_long_prompts(tmp_path, "gpt_oss")


@torch.inference_mode()
def test_the_moe_layer_matches_transformers_gpt_oss_mlp() -> None:
    """Router bias, top-2 of 4 experts, interleaved gate/up with biases and the clamped
    SwiGLU (its limit reached: gate/up values beyond it), against HF's own module."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = GptOssConfig(**tiny_config_kwargs(**ARCH_OVERRIDES["gpt_oss"]))
    torch.manual_seed(0)
    hf = GptOssMLP(config).eval()
    for param in hf.parameters():
        param.normal_(0, 0.5)
    ours = gpt_oss_moe(config)
    for tensor in ("gate_up_proj", "down_proj"):
        load_stacked_weights(ours.experts, tensor, getattr(hf.experts, tensor), tensor)
        load_stacked_biases(ours.experts, tensor, getattr(hf.experts, f"{tensor}_bias"), tensor)
    ours.gate.weight.copy_(hf.router.weight)
    ours.gate.bias.copy_(hf.router.bias)
    x = torch.randn(9, config.hidden_size)
    assert (x @ hf.experts.gate_up_proj[0]).abs().max() > 2 * config.swiglu_limit
    expected, _ = hf(x[None])
    torch.testing.assert_close(ours(x), expected[0], rtol=1e-5, atol=1e-5)


def test_interleaved_gate_up_columns_land_in_their_halves(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "gpt_oss", "gpt_oss")
    state = load_file(str(model_dir / "model.safetensors"))
    model = load(model_dir)
    layer = model.layers[2]
    experts, size = layer.mlp.experts, layer.mlp.experts.size
    gate_up = state["model.layers.2.mlp.experts.gate_up_proj"][3]  # [H, 2I]
    gate_up_bias = state["model.layers.2.mlp.experts.gate_up_proj_bias"][3]
    assert torch.equal(experts.w13_weight[3, :size], gate_up[:, 0::2].t())
    assert torch.equal(experts.w13_weight[3, size:], gate_up[:, 1::2].t())
    assert torch.equal(experts.w13_bias[3, :size], gate_up_bias[0::2])
    assert torch.equal(experts.w13_bias[3, size:], gate_up_bias[1::2])
    assert torch.equal(experts.w2_weight[3], state["model.layers.2.mlp.experts.down_proj"][3].t())
    assert torch.equal(layer.mlp.gate.bias, state["model.layers.2.mlp.router.bias"])
    assert torch.equal(layer.self_attn.sinks, state["model.layers.2.self_attn.sinks"])
    assert [layer.self_attn.attn.sliding_window for layer in model.layers] == [24, None, 24]


def test_mxfp4_checkpoints_are_refused_naming_the_quantization(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "gpt_oss", "gpt_oss")
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"quantization_config \(quant_method 'mxfp4'\)"):
        load(model_dir)


def test_a_stacked_expert_tensor_of_the_wrong_count_is_named(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "gpt_oss", "gpt_oss")
    path = str(model_dir / "model.safetensors")
    state = load_file(path)
    name = "model.layers.1.mlp.experts.gate_up_proj_bias"
    state[name] = state[name][:3].clone()
    save_file(state, path)
    with pytest.raises(ValueError, match=rf"{name}: .*\(3, 96\), the model expects 4 experts"):
        load(model_dir)
