"""Qwen3-MoE: the Qwen3 layer (an RMSNorm over each query and key head, a `head_dim` of its
own) whose MLP is a mixture of `num_experts` experts of `moe_intermediate_size`, top
`num_experts_per_tok` renormalised where `norm_topk_prob`; `mlp_only_layers` and
`decoder_sparse_step` leave some layers a dense MLP."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention
from pagedserve.services.gpu_worker.models.moe_base import MoEDecoderLM, qwen_moe_mlp


class Qwen3MoeForCausalLM(MoEDecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        head_norm = partial(RMSNorm, eps=eps)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                llama_attention(config, backend_cls, head_norm=head_norm, sliding_window=window),
                qwen_moe_mlp(config, index),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for index, window in enumerate(self.windows)
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)
