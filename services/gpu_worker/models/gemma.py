"""Gemma (1): the Llama layer with GeGLU (`gelu_pytorch_tanh`), RMSNorm scaling by (1 + w),
embeddings multiplied by sqrt(hidden_size), and the LM head tied to the embedding."""

from __future__ import annotations

from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.norm import GemmaRMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_mlp


class GemmaForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                llama_attention(config, backend_cls),
                llama_mlp(config),
                GemmaRMSNorm(config.hidden_size, eps),
                GemmaRMSNorm(config.hidden_size, eps),
            )
            for _ in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)
        self.embed_scale = config.hidden_size**0.5
