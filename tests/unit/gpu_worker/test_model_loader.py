"""Loading Hugging Face directories: sharded checkpoints, and clear errors for what we can't."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.layers.rope_scaling import rope_inv_freq, yarn_attention_factor
from pagedserve.services.gpu_worker.model_loader import load_model
from pagedserve.services.gpu_worker.models import get_model_cls
from tests.fixtures.tiny_models import build_tiny_model


def load(model_dir: Path):
    return load_model(model_dir, TorchAttentionBackend, torch.float32, torch.device("cpu"), False)


def split_into_shards(model_dir: Path) -> None:
    """Rewrite model.safetensors as two shards plus the index json, as large models ship."""
    state = load_file(str(model_dir / "model.safetensors"))
    names = sorted(state)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, str(model_dir / file))
        weight_map.update(dict.fromkeys(part, file))
    (model_dir / "model.safetensors").unlink()
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_sharded_checkpoint_loads_the_same_weights(tmp_path: Path):
    single = load(build_tiny_model(tmp_path / "single", "qwen2"))
    sharded_dir = build_tiny_model(tmp_path / "sharded", "qwen2")
    split_into_shards(sharded_dir)
    sharded = load(sharded_dir)
    for (name, a), (_, b) in zip(
        single.state_dict().items(), sharded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_missing_weight_is_named(tmp_path: Path):
    model_dir = build_tiny_model(tmp_path / "m", "llama")
    state = load_file(str(model_dir / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(model_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weight.*layers\.1\.mlp\.gate_up_proj\.weight:1"):
        load(model_dir)


def test_unexpected_weight_is_named(tmp_path: Path):
    model_dir = build_tiny_model(tmp_path / "m", "llama")
    state = load_file(str(model_dir / "model.safetensors"))
    state["model.layers.0.mystery.weight"] = torch.zeros(2)
    save_file(state, str(model_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mystery\.weight' has no place"):
        load(model_dir)


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match=r"unsupported model architecture \['GPT2LMHeadModel'\]"):
        get_model_cls(["GPT2LMHeadModel"])
    assert get_model_cls([], "mistral").__name__ == "LlamaForCausalLM"


def test_missing_files_are_clear_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load(tmp_path)
    model_dir = build_tiny_model(tmp_path / "m", "llama")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load(model_dir)


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 16,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
    ],
)
def test_rope_scaling_matches_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rope_scaling=dict(scaling),
        rope_theta=500000.0,
    )
    expected, attention_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    torch.testing.assert_close(rope_inv_freq(16, 500000.0, scaling), expected.float())
    if scaling["rope_type"] == "yarn":
        assert yarn_attention_factor(scaling) == pytest.approx(attention_factor, rel=1e-12)


def test_unsupported_rope_scaling_is_a_clear_error():
    with pytest.raises(ValueError, match="rope_scaling type 'proportional' is not supported"):
        rope_inv_freq(16, 10000.0, {"rope_type": "proportional", "factor": 2.0})


def test_rope_scaled_model_matches_hf(tmp_path: Path):
    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import CacheConfig, SchedulerConfig
    from pagedserve.shared.protocol import SamplingParams
    from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf

    scaling = {"rope_type": "linear", "factor": 2.0}
    model_dir = build_tiny_model(tmp_path / "m", "llama", rope_scaling=scaling)
    engine = LLMEngine(
        model_dir,
        SchedulerConfig(max_model_len=256),
        CacheConfig(block_size=8, num_blocks=64),
        dtype="float32",
    )
    prompt = list(range(5, 105))
    result = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert_matches_hf(result[0].token_ids, hf_greedy(load_hf(model_dir), prompt, 8))


def rewrite_config(model_dir: Path, **fields: object) -> Path:
    config = json.loads((model_dir / "config.json").read_text())
    config.update(fields)
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
    ],
)
def test_unsupported_config_features_are_named(tmp_path: Path, fields, named):
    model_dir = rewrite_config(build_tiny_model(tmp_path / "m", "llama"), **fields)
    with pytest.raises(ValueError, match=named):
        load(model_dir)


def test_llama_biases_load_into_the_model(tmp_path: Path):
    model = load(build_tiny_model(tmp_path / "m", "llama_biases"))
    layer = model.layers[0]
    assert layer.self_attn.qkv_proj.bias is not None and layer.self_attn.o_proj.bias is not None
    assert layer.mlp.gate_up_proj.bias is not None and layer.mlp.down_proj.bias is not None
