"""Phi-3 (mini, small, medium): the Llama layer, its checkpoint holding q/k/v as one
`qkv_proj` tensor and gate/up as one `gate_up_proj`, with longrope scaling (see
`layers/rope_scaling.py`: the long factors from the original length on, per position)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import (
    DecoderLM,
    attention_geometry,
    config_value,
)
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_layer


class Phi3ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        self.layers = nn.ModuleList(
            llama_layer(config, llama_attention(config, backend_cls, sliding_window=window))
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, config_value(config, "rms_norm_eps", 1e-6))
        self.rotary = rotary_from_config(config, self.head_dim)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_fused(weights))

    def _split_fused(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's fused q/k/v and gate/up tensors as the separate ones that the
        shared layers load (each rank then takes its slice of each)."""
        num_heads, num_kv_heads, head_dim = attention_geometry(self.config)
        qkv_sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        for name, tensor in weights:
            if name.endswith("self_attn.qkv_proj.weight"):
                parts = tensor.split(qkv_sizes, dim=0)
                for part_name, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                    yield name.replace("qkv_proj", part_name), part
            elif name.endswith("mlp.gate_up_proj.weight"):
                gate, up = tensor.chunk(2, dim=0)
                yield name.replace("gate_up_proj", "gate_proj"), gate
                yield name.replace("gate_up_proj", "up_proj"), up
            else:
                yield name, tensor
