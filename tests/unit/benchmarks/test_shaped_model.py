"""Random models of public shapes (`benchmarks/shaped_model.py`): each shape is a valid
transformers config, and a written model (a small shape here) loads, has random biases and the
default model's tokenizer, and generates."""

from __future__ import annotations

import pytest
import torch

from benchmarks import shaped_model
from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams


@pytest.mark.parametrize("name", sorted(shaped_model.SHAPES))
def test_each_shape_is_a_config_transformers_takes(name):
    from transformers import CONFIG_MAPPING

    shape = dict(shaped_model.SHAPES[name])
    config = CONFIG_MAPPING[shape.pop("model_type")](**shape)
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.num_attention_heads % config.num_key_value_heads == 0


def write_small(name, num_layers, tmp_path, monkeypatch):
    """A written model of `name`'s kind at a tiny width, and an engine over it."""
    small = dict(shaped_model.SHAPES[name])
    small.update(hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    monkeypatch.setitem(shaped_model.SHAPES, "small", small)
    out = shaped_model.write_shaped_model("small", tmp_path / "small")
    engine = LLMEngine(out, SchedulerConfig(max_model_len=256), CacheConfig(num_blocks=32),
                       dtype="float32")  # fmt: skip
    return out, engine


def test_a_written_model_loads_with_random_biases_and_generates(tmp_path, monkeypatch):
    out, engine = write_small("qwen2.5-0.5b", 2, tmp_path, monkeypatch)
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    bias = engine.runner.model.layers[0].self_attn.qkv_proj.bias
    assert bias is not None and bool(bias.abs().sum() > 0)
    result = engine.generate(["Hello"], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(result.token_ids) == 4
    assert torch.tensor(result.token_ids).lt(49152).all()
    assert shaped_model.write_shaped_model("small", out) == out  # kept, not written again


def test_smollm3s_shape_writes_a_model_with_its_nope_layers(tmp_path, monkeypatch):
    _, engine = write_small("smollm3-3b", 8, tmp_path, monkeypatch)
    model = engine.runner.model
    assert type(model).__name__ == "SmolLM3ForCausalLM"
    assert [layer.self_attn.use_rope for layer in model.layers] == [True, True, True, False] * 2
    result = engine.generate(["Hello"], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(result.token_ids) == 4


@pytest.mark.parametrize(("name", "architecture"), [
    ("olmo2-1b", "Olmo2ForCausalLM"), ("exaone4-1.2b", "Exaone4ForCausalLM"),
])  # fmt: skip
def test_the_post_norm_shapes_write_full_attention_models(
    name, architecture, tmp_path, monkeypatch
):
    """OLMo 2's and EXAONE 4's shapes: no window, every layer rotating (EXAONE 4's full
    layers rotate only without a window), so the CPU fused pass can take them."""
    two_layers = {**shaped_model.SHAPES[name], "layer_types": ["full_attention"] * 2}
    monkeypatch.setitem(shaped_model.SHAPES, name, two_layers)
    _, engine = write_small(name, 2, tmp_path, monkeypatch)
    model = engine.runner.model
    assert type(model).__name__ == architecture
    assert [spec.sliding_window for spec in model.kv_cache_specs()] == [None, None]
    assert all(layer.self_attn.use_rope for layer in model.layers)
