"""GPT-OSS: pre-norm layers alternating between a sliding window and full attention
(`layer_types`), q/k/v/o biases, a learned sink logit per attention head that joins the
softmax's denominator, yarn RoPE, and a mixture of experts whose router and experts carry
biases: the top `num_experts_per_tok` router logits softmaxed, each expert a clamped SwiGLU
(`ClampedSwigluAndMul`: `swiglu_alpha`, `swiglu_limit`, (up + 1) * glu).

The checkpoint stores each layer's experts stacked and transposed, `experts.gate_up_proj`
[E, H, 2I] with gate and up columns interleaved (gate at even columns), `down_proj`
[E, I, H], and their biases; the router is `mlp.router`. They are split into the per-expert
halves `StackedExperts` holds at load. MXFP4-quantized checkpoints (`quantization_config`)
are refused: their experts are `*_blocks` / `*_scales` pairs no linear method here reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.activation import ClampedSwigluAndMul
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE, StackedExperts
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import config_value, refuse
from pagedserve.services.gpu_worker.models.llama import llama_attention
from pagedserve.services.gpu_worker.models.moe_base import MoEDecoderLM

# `<prefix>.experts.<tensor>`: one layer's experts, stacked
STACKED_EXPERTS_NAME = re.compile(
    r"^(?P<prefix>.+\.experts)\.(?P<tensor>gate_up_proj|down_proj)(?P<bias>_bias)?$"
)


def refuse_quantized(config: Any) -> None:
    """GPT-OSS ships MXFP4 experts; only unquantized (bf16, fp32) checkpoints load here."""
    quantization = getattr(config, "quantization_config", None)
    if quantization:
        method = (
            quantization.get("quant_method")
            if isinstance(quantization, dict)
            else getattr(quantization, "quant_method", None)
        )
        refuse(
            config,
            f"quantization_config (quant_method {method!r})",
            "unquantized checkpoints only: dequantize the experts to bf16 first",
        )


def gpt_oss_moe(config: Any) -> FusedMoE:
    return FusedMoE(
        config.hidden_size,
        config.intermediate_size,
        config.num_local_experts,
        # softmax over all experts renormalised over the chosen: the chosen logits' softmax
        Routing(config.num_experts_per_tok, renormalize=True),
        router_bias=True,
        expert_bias=True,
        act_and_mul=ClampedSwigluAndMul(
            config_value(config, "swiglu_alpha", 1.702), config_value(config, "swiglu_limit", 7.0)
        ),
    )


class GptOssForCausalLM(MoEDecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        refuse_quantized(config)
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-5)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                llama_attention(config, backend_cls, sliding_window=window, sinks=True),
                gpt_oss_moe(config),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)

    def checkpoint_name(self, hf_name: str) -> str | None:
        name = super().checkpoint_name(hf_name)
        return None if name is None else name.replace(".mlp.router.", ".mlp.gate.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts = {name: m for name, m in self.named_modules() if isinstance(m, StackedExperts)}
        loaded: set[str] = set()

        def others(pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for hf_name, tensor in pairs:
                match = STACKED_EXPERTS_NAME.match(self.checkpoint_name(hf_name) or "")
                if match is None:
                    yield hf_name, tensor
                    continue
                module = experts.get(match["prefix"])
                if module is None:
                    raise ValueError(f"checkpoint tensor {hf_name!r} has no place in the model")
                load = load_stacked_biases if match["bias"] else load_stacked_weights
                names = load(module, match["tensor"], tensor, hf_name)
                loaded.update(f"{match['prefix']}.{name}" for name in names)

        return super().load_weights(others(weights)) | loaded


def _per_expert(module: StackedExperts, loaded: torch.Tensor, hf_name: str) -> torch.Tensor:
    if loaded.dim() < 2 or loaded.shape[0] != module.num_experts:
        raise ValueError(
            f"{hf_name}: checkpoint tensor has shape {tuple(loaded.shape)}, the model expects "
            f"{module.num_experts} experts stacked in its first dimension"
        )
    return loaded


def load_stacked_weights(
    module: StackedExperts, tensor: str, loaded: torch.Tensor, hf_name: str
) -> list[str]:
    """`gate_up_proj` [E, H, 2I] (gate, up interleaved) or `down_proj` [E, I, H] into every
    expert's slots; returns what was loaded, in `expected_weights`' terms."""
    names = []
    for expert, weight in enumerate(_per_expert(module, loaded, hf_name)):
        if tensor == "down_proj":
            module.load_expert(expert, "down", weight.t())
            names.append(f"w2_weight:{expert}:down")
        else:
            module.load_expert(expert, "gate", weight[:, 0::2].t())
            module.load_expert(expert, "up", weight[:, 1::2].t())
            names += [f"w13_weight:{expert}:gate", f"w13_weight:{expert}:up"]
    return names


def load_stacked_biases(
    module: StackedExperts, tensor: str, loaded: torch.Tensor, hf_name: str
) -> list[str]:
    """`gate_up_proj_bias` [E, 2I] (interleaved) or `down_proj_bias` [E, H]."""
    for expert, bias in enumerate(_per_expert(module, loaded, hf_name)):
        if tensor == "down_proj":
            module.load_expert_bias(expert, "down", bias)
        else:
            module.load_expert_bias(expert, "gate", bias[0::2])
            module.load_expert_bias(expert, "up", bias[1::2])
    return ["w2_bias" if tensor == "down_proj" else "w13_bias"]
