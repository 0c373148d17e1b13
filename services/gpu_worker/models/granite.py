"""Granite (3.x dense): the Llama layer with four multipliers from the config: the embeddings
(`embedding_multiplier`), the attention scale (`attention_multiplier`, in place of
head_dim ** -0.5), each branch before its residual add (`residual_multiplier`) and the logits
(divided by `logits_scaling`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_layer


class GraniteForCausalLM(DecoderLM):
    embed_scale_in_dtype = False

    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        scale = float(config.attention_multiplier)
        self.layers = nn.ModuleList(
            llama_layer(
                config,
                llama_attention(config, backend_cls, scale=scale),
                residual_multiplier=float(config.residual_multiplier),
            )
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config_value(config, "rms_norm_eps", 1e-6))
        self.rotary = rotary_from_config(config, self.head_dim)
        self.embed_scale = float(config.embedding_multiplier)
        self.logits_scaling = float(config.logits_scaling)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden)
        return None if logits is None else logits / self.logits_scaling
