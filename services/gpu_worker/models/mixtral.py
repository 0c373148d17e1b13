"""Mixtral: the Mistral layer (with its sliding window wherever the config states one) whose
MLP is a mixture of experts, `num_experts_per_tok` of `num_local_experts` per token, their
weights renormalised to sum 1. Checkpoints name the MoE `block_sparse_moe`, its experts'
projections w1 (gate), w3 (up) and w2 (down)."""

from __future__ import annotations

from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention
from pagedserve.services.gpu_worker.models.moe_base import MoEDecoderLM


class MixtralForCausalLM(MoEDecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        # Hugging Face applies a stated window to every layer, with no flag to switch it on
        self.windows = [config_value(config, "sliding_window", None)] * config.num_hidden_layers
        eps = config_value(config, "rms_norm_eps", 1e-5)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                llama_attention(config, backend_cls, sliding_window=window),
                mixtral_moe(config),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)

    def checkpoint_name(self, hf_name: str) -> str | None:
        name = super().checkpoint_name(hf_name)
        return None if name is None else name.replace(".block_sparse_moe.", ".mlp.")


def mixtral_moe(config: Any) -> FusedMoE:
    return FusedMoE(
        config.hidden_size,
        config.intermediate_size,
        config.num_local_experts,
        Routing(config.num_experts_per_tok, renormalize=True),
        hidden_act=config_value(config, "hidden_act", "silu"),
    )
