"""Gemma 2: Gemma's (1 + w) norms, GeGLU and scaled embeddings, with each branch normed
before and after (`SandwichDecoderLayer`), layers alternating between a sliding window and
full attention (`layer_types`), attention scores soft-capped (`attn_logit_softcapping`) and
scaled by `query_pre_attn_scalar`, and the logits soft-capped (`final_logit_softcapping`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.decoder_layer import SandwichDecoderLayer
from pagedserve.services.gpu_worker.layers.norm import GemmaRMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_mlp


def sandwich_layers(
    config: Any,
    backend_cls: type[BaseAttentionBackend],
    windows: list[int | None],
    **attention_kwargs: Any,
) -> nn.ModuleList:
    """Gemma 2 and 3's layers: (1 + w) sandwich norms, attention scaled by
    `query_pre_attn_scalar`, each layer's window."""
    eps = config_value(config, "rms_norm_eps", 1e-6)
    scale = config.query_pre_attn_scalar**-0.5
    return nn.ModuleList(
        SandwichDecoderLayer(
            llama_attention(
                config, backend_cls, scale=scale, sliding_window=window, **attention_kwargs
            ),
            llama_mlp(config),
            GemmaRMSNorm,
            config.hidden_size,
            eps,
        )
        for window in windows
    )


class Gemma2ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        softcap = config_value(config, "attn_logit_softcapping", None)
        self.layers = sandwich_layers(config, backend_cls, self.windows, logit_softcap=softcap)
        self.norm = GemmaRMSNorm(config.hidden_size, config_value(config, "rms_norm_eps", 1e-6))
        self.rotary = rotary_from_config(config, self.head_dim)
        self.embed_scale = config.hidden_size**0.5
        self.final_logit_softcap = config_value(config, "final_logit_softcapping", None)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden)
        if logits is None or self.final_logit_softcap is None:
            return logits
        cap = self.final_logit_softcap
        return torch.tanh(logits / cap) * cap
