"""Qwen2-MoE: the Qwen2 layer (q/k/v biases where `qkv_bias`) whose MLP is a mixture of
`num_experts` experts, top `num_experts_per_tok` (not renormalised unless `norm_topk_prob`),
plus a shared expert every token passes through, scaled by sigmoid(x `shared_expert_gate`).
`mlp_only_layers` and `decoder_sparse_step` leave some layers a dense MLP."""

from __future__ import annotations

from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.attention import Attention
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import attention_geometry, config_value
from pagedserve.services.gpu_worker.models.moe_base import MoEDecoderLM, qwen_moe_mlp


class Qwen2MoeForCausalLM(MoEDecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                qwen2_moe_attention(config, backend_cls, window),
                qwen_moe_mlp(config, index, shared_expert(config)),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for index, window in enumerate(self.windows)
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)


def shared_expert(config: Any) -> GatedMLP:
    """Unreduced: `FusedMoE` adds its partial sum to the routed experts' before one
    all-reduce."""
    act = config_value(config, "hidden_act", "silu")
    return GatedMLP(
        config.hidden_size, config.shared_expert_intermediate_size, act, reduce_results=False
    )


def qwen2_moe_attention(
    config: Any, backend_cls: type[BaseAttentionBackend], window: int | None
) -> Attention:
    qkv_bias = bool(config_value(config, "qkv_bias", True))
    geometry = attention_geometry(config)
    return Attention(
        config.hidden_size, *geometry, backend_cls, qkv_bias=qkv_bias, sliding_window=window
    )
