"""Qwen3 (dense): the Llama layer with an RMSNorm over each query and key head before the
rotary embedding, and a `head_dim` of its own (not hidden / heads)."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_layer


class Qwen3ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        head_norm = partial(RMSNorm, eps=eps)
        self.layers = nn.ModuleList(
            llama_layer(
                config,
                llama_attention(config, backend_cls, head_norm=head_norm, sliding_window=window),
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)
