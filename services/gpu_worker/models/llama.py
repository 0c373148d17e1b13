"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM2): GQA, RoPE, RMSNorm, SwiGLU, with
Llama's optional `attention_bias` (q/k/v and o) and `mlp_bias`; Qwen2 has a q/k/v bias.

Tokens of every sequence in a step are packed into one flat batch `[num_tokens, hidden]`;
attention reads and writes the paged KV cache through the backend.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.attention import Attention
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import (
    DecoderLM,
    attention_geometry,
    config_value,
)


def llama_attention(
    config: Any, backend_cls: type[BaseAttentionBackend], **kwargs: Any
) -> Attention:
    attention_bias = bool(config_value(config, "attention_bias", False))
    qkv_bias = attention_bias or config.model_type == "qwen2"
    return Attention(
        config.hidden_size, *attention_geometry(config), backend_cls,
        qkv_bias=qkv_bias, o_bias=attention_bias, **kwargs,
    )  # fmt: skip


def llama_mlp(config: Any) -> GatedMLP:
    return GatedMLP(
        config.hidden_size,
        config.intermediate_size,
        # Gemma 2 and 3 name it hidden_activation
        config_value(config, "hidden_activation", config_value(config, "hidden_act", "silu")),
        bias=bool(config_value(config, "mlp_bias", False)),
    )


def llama_layer(config: Any, attention: Attention, **kwargs: Any) -> PreNormDecoderLayer:
    eps = config_value(config, "rms_norm_eps", 1e-6)
    return PreNormDecoderLayer(
        attention,
        llama_mlp(config),
        RMSNorm(config.hidden_size, eps),
        RMSNorm(config.hidden_size, eps),
        **kwargs,
    )


class LlamaForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        self.layers = nn.ModuleList(
            llama_layer(config, llama_attention(config, backend_cls, sliding_window=window))
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, config_value(config, "rms_norm_eps", 1e-6))
        self.rotary = rotary_from_config(config, self.head_dim)
