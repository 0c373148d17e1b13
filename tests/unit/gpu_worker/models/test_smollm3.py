"""SmolLM3's layers as its config states them: which rotate (`no_rope_layers`), which attend
within a window, and `no_rope_layers` it cannot hold refused by name."""

from __future__ import annotations

import pytest
from transformers import SmolLM3Config

from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.models.smollm3 import SmolLM3ForCausalLM
from tests.fixtures.tiny_models import tiny_config_kwargs


def smollm3(**overrides) -> SmolLM3ForCausalLM:
    config = SmolLM3Config(**tiny_config_kwargs(num_hidden_layers=8, **overrides))
    return SmolLM3ForCausalLM(config, TorchAttentionBackend)


def test_every_fourth_layer_is_nope_by_default():
    model = smollm3()
    assert [layer.self_attn.use_rope for layer in model.layers] == [True, True, True, False] * 2
    assert model.windows == [None] * 8


def test_an_interval_and_windows_on_the_nope_layers():
    model = smollm3(no_rope_layer_interval=3, use_sliding_window=True, sliding_window=16)
    assert [layer.self_attn.use_rope for layer in model.layers] == [1, 1, 0, 1, 1, 0, 1, 1]
    assert model.windows == [None, None, 16, None, None, 16, None, None]
    assert [layer.self_attn.attn.sliding_window for layer in model.layers] == model.windows


def test_layer_types_use_no_window_without_use_sliding_window():
    """Hugging Face applies `sliding_window` only where `use_sliding_window` is set."""
    types = ["sliding_attention", "full_attention"] * 4
    model = smollm3(sliding_window=16, layer_types=types)
    assert model.windows == [None] * 8


@pytest.mark.parametrize("flags", [[1] * 7, [1, 1, 1, 2] * 2])
def test_no_rope_layers_it_cannot_hold_are_refused(flags):
    with pytest.raises(ValueError, match=r"SmolLM3ForCausalLM: no_rope_layers .* not supported"):
        smollm3(
            no_rope_layers=flags, layer_types=["full_attention"] * 8,
            architectures=["SmolLM3ForCausalLM"],
        )  # fmt: skip
