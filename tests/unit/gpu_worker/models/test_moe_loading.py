"""MoE checkpoints as Hugging Face writes them: per-expert tensors stacked at load, and a
missing, extra or out-of-range expert named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.fixtures.tiny_models import build_tiny_model
from tests.unit.gpu_worker.test_model_loader import load


def edited_checkpoint(tmp_path: Path, arch: str, edit) -> Path:
    model_dir = build_tiny_model(tmp_path / arch, arch)
    state = load_file(str(model_dir / "model.safetensors"))
    edit(state)
    save_file(state, str(model_dir / "model.safetensors"))
    return model_dir


def test_each_expert_projection_lands_in_its_stacked_slot(tmp_path: Path):
    model_dir = build_tiny_model(tmp_path / "mixtral", "mixtral")
    state = load_file(str(model_dir / "model.safetensors"))
    experts = load(model_dir).layers[1].mlp.experts
    prefix = "model.layers.1.block_sparse_moe.experts.3"
    size = experts.size
    assert torch.equal(experts.w13_weight[3, :size], state[f"{prefix}.w1.weight"])
    assert torch.equal(experts.w13_weight[3, size:], state[f"{prefix}.w3.weight"])
    assert torch.equal(experts.w2_weight[3], state[f"{prefix}.w2.weight"])


def test_a_missing_expert_tensor_is_named(tmp_path: Path):
    model_dir = edited_checkpoint(
        tmp_path, "qwen3_moe", lambda s: s.pop("model.layers.2.mlp.experts.1.up_proj.weight")
    )
    with pytest.raises(
        ValueError, match=r"missing weight.*layers\.2\.mlp\.experts\.w13_weight:1:up"
    ):
        load(model_dir)


def test_an_expert_the_config_does_not_have_is_refused(tmp_path: Path):
    def add_fifth_expert(state):
        name = "model.layers.0.block_sparse_moe.experts.{}.w2.weight"
        state[name.format(4)] = state[name.format(0)].clone()

    with pytest.raises(ValueError, match=r"expert 4 is out of range \(the config has 4\)"):
        load(edited_checkpoint(tmp_path, "mixtral", add_fifth_expert))


def test_experts_in_a_dense_layer_have_no_place(tmp_path: Path):
    """Layer 1 of the tiny Qwen2-MoE is dense (`mlp_only_layers`)."""

    def add_expert(state):
        state["model.layers.1.mlp.experts.0.gate_proj.weight"] = torch.zeros(48, 64)

    with pytest.raises(ValueError, match=r"experts\.0\.gate_proj\.weight' has no place"):
        load(edited_checkpoint(tmp_path, "qwen2_moe", add_expert))
