"""Every supported architecture against transformers (see `arch_check.py`)."""

from __future__ import annotations

from tests.unit.gpu_worker.models.arch_check import check_architecture, check_generation_past


def test_llama_with_attention_and_mlp_biases(tmp_path):
    check_architecture(tmp_path, "llama_biases")


def test_qwen3(tmp_path):
    check_architecture(tmp_path, "qwen3")


def test_gemma(tmp_path):
    check_architecture(tmp_path, "gemma")


def test_olmo2(tmp_path):
    check_architecture(tmp_path, "olmo2")


def test_granite(tmp_path):
    check_architecture(tmp_path, "granite")


def test_llama_with_yarn_rope(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    check_architecture(tmp_path, "llama", rope_scaling=yarn)


def test_llama_with_dynamic_ntk_rope_past_its_original_length(tmp_path):
    """Prompts within the original 64 positions, generation well past them (where Hugging
    Face recomputes the frequencies at every step; see `rope_scaling.py`)."""
    dynamic = {"rope_type": "dynamic", "factor": 4.0}
    check_generation_past(tmp_path, "llama", 64, rope_scaling=dynamic, max_position_embeddings=64)


def test_phi3(tmp_path):
    check_architecture(tmp_path, "phi3")


def test_phi3_with_longrope_within_its_original_length(tmp_path):
    """The short factors and longrope's attention factor (Hugging Face recomputes a sequence
    that outgrows the original length with the long factors; we switch per position)."""
    longrope = {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.2 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
    }
    check_architecture(
        tmp_path, "phi3", rope_scaling=longrope, original_max_position_embeddings=256
    )


def test_mistral_with_a_window_shorter_than_the_prompts(tmp_path):
    check_architecture(tmp_path, "mistral", sliding_window=24)


def test_qwen2_with_windows_on_its_upper_layers(tmp_path):
    """`max_window_layers` 1: layer 0 attends to everything, layers 1-2 within 24 tokens."""
    check_architecture(
        tmp_path, "qwen2", use_sliding_window=True, sliding_window=24, max_window_layers=1,
        num_hidden_layers=3,
    )  # fmt: skip


def test_gemma2_with_soft_capping_and_alternating_window_layers(tmp_path):
    check_architecture(tmp_path, "gemma2")


def test_gemma3_text_with_local_and_global_rope(tmp_path):
    check_architecture(tmp_path, "gemma3_text")


def test_smollm3_with_a_nope_layer(tmp_path):
    """Layers 0-2 rotate their queries and keys, layer 3 (every fourth) does not."""
    check_architecture(tmp_path, "smollm3")


def test_smollm3_with_its_own_nope_layers_and_windows_on_them(tmp_path):
    """`no_rope_layers` as stated (NoPE first), and with `use_sliding_window` the NoPE layers
    attend within 24 tokens, the others to everything."""
    check_architecture(
        tmp_path, "smollm3", no_rope_layers=[0, 1, 0, 1], use_sliding_window=True,
        sliding_window=24,
    )  # fmt: skip


def test_olmo3_with_window_layers_and_a_full_one(tmp_path):
    check_architecture(tmp_path, "olmo3")


def test_olmo3_with_yarn_on_its_full_attention_layer_only(tmp_path):
    """Rope parameters by layer type: yarn over 64 original positions on the full-attention
    layer, another theta on the window layers."""
    rope = {
        "full_attention": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
    }  # fmt: skip
    check_architecture(tmp_path, "olmo3", rope_parameters=rope)


def test_exaone4_with_window_layers_and_a_full_one_without_rotary(tmp_path):
    check_architecture(tmp_path, "exaone4")


def test_exaone4_without_a_window_every_layer_rotates(tmp_path):
    check_architecture(
        tmp_path, "exaone4", sliding_window=None, layer_types=["full_attention"] * 4
    )  # fmt: skip


def test_ernie4_5_with_its_interleaved_rotary_pairs(tmp_path):
    check_architecture(tmp_path, "ernie4_5")


def test_ernie4_5_with_biases_on_every_linear(tmp_path):
    check_architecture(tmp_path, "ernie4_5", use_bias=True)
