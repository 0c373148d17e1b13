"""Gemma 3 (text): Gemma 2's layer without soft-capping, with a (1 + w) RMSNorm over each
query and key head, and two rotary embeddings: the local one (its own theta) in the sliding
window layers, the global one in the full-attention layers (`rope_parameters` by layer type).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import GemmaRMSNorm
from pagedserve.services.gpu_worker.layers.rotary import (
    RopeAngles,
    RotaryEmbedding,
    rotary_from_params,
)
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.gemma2 import sandwich_layers


class Gemma3ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        head_norm = partial(GemmaRMSNorm, eps=eps)
        self.layers = sandwich_layers(config, backend_cls, self.windows, head_norm=head_norm)
        self.norm = GemmaRMSNorm(config.hidden_size, eps)
        params = config.rope_parameters
        self.rotary = rotary_from_params(config, self.head_dim, params["full_attention"])
        self.local_rotary: RotaryEmbedding = rotary_from_params(
            config, self.head_dim, params["sliding_attention"]
        )
        self.embed_scale = config.hidden_size**0.5

    def layer_angles(self, positions: torch.Tensor) -> list[RopeAngles]:
        return self.local_and_global_angles(positions)
