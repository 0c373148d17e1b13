"""ERNIE 4.5 (dense): the Llama layer with `use_bias` on every linear, and GLM-style rotary
embedding: each head's dimensions rotate in interleaved pairs (x0, x1), (x2, x3), ..., pair i
by frequency i. The pairs are taken apart at load time: each head's query and key rows are
reordered, evens then odds, after which the usual rotate-half rotation turns dimensions i and
i + D/2 as the interleaved one turns 2i and 2i + 1. Queries and keys are permuted alike, so
every query-key product is the interleaved model's; values are not touched. At run time the
model is a Llama one (the CPU's fused pass takes it where it has no MLP bias)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
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


def deinterleave_heads(tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A q or k projection's weight [heads * D, ...] or bias [heads * D] with each head's rows
    in the order 0, 2, 4, ..., 1, 3, 5, ...: interleaved rotary pairs made rotate-half ones."""
    rows = tensor.shape[0]
    if rows % head_dim or head_dim % 2:
        raise ValueError(f"{rows} rows are not whole heads of {head_dim} (even) dimensions")
    trailing = tensor.shape[1:]
    pairs = tensor.reshape(rows // head_dim, head_dim // 2, 2, *trailing)
    return pairs.transpose(1, 2).reshape(tensor.shape).contiguous()


class Ernie4_5ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-5)
        bias = bool(config_value(config, "use_bias", False))
        act = config_value(config, "hidden_act", "silu")
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                Attention(
                    config.hidden_size,
                    *attention_geometry(config),
                    backend_cls,
                    qkv_bias=bias,
                    o_bias=bias,
                    sliding_window=window,
                ),
                GatedMLP(config.hidden_size, config.intermediate_size, act, bias=bias),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def rotate_half_layout() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if ".q_proj." in name or ".k_proj." in name:
                    tensor = deinterleave_heads(tensor, self.head_dim)
                yield name, tensor

        return super().load_weights(rotate_half_layout())
