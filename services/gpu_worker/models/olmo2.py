"""OLMo 2: norms after each branch instead of before it, and an RMSNorm over the whole query
and key projections (not per head) before the rotary embedding:

    h = x + norm1(attn(x));   out = h + norm2(mlp(h))

The q/k norms span every head, so under tensor parallelism each rank would need the others'
sums: refused there.

OLMo 3: OLMo 2's layers, sliding-window attention where `layer_types` says so (three of every
four layers by default), and rope parameters by layer type (the long-context checkpoints put
yarn on the full-attention layers only).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.attention import Attention
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import (
    RopeAngles,
    RotaryEmbedding,
    rotary_from_config,
    rotary_from_params,
)
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_mlp
from pagedserve.services.gpu_worker.parallel_state import get_tp_world_size


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, self_attn: Attention, mlp: GatedMLP, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self,
        angles: RopeAngles,
        hidden: torch.Tensor,  # [T, H] the previous layer's output
        residual: None,  # post-norm layers keep no running residual
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, None]:
        attended, _ = self.post_attention_layernorm(
            self.self_attn(angles, hidden, kv_cache, metadata)
        )
        hidden = hidden + attended
        mlp_out, _ = self.post_feedforward_layernorm(self.mlp(hidden))
        return hidden + mlp_out, None


def post_norm_layer(
    config: Any, backend_cls: type[BaseAttentionBackend], eps: float, **attention: Any
) -> Olmo2DecoderLayer:
    """OLMo 2's layer with a Llama MLP and `llama_attention(**attention)` (OLMo 2/3, EXAONE 4)."""
    return Olmo2DecoderLayer(
        llama_attention(config, backend_cls, **attention), llama_mlp(config), config.hidden_size,
        eps,
    )  # fmt: skip


class Olmo2ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        if get_tp_world_size() > 1:
            name = type(self).__name__
            raise ValueError(f"{name}: tensor parallelism is not supported (q/k norms)")
        eps = config_value(config, "rms_norm_eps", 1e-6)
        norm = partial(RMSNorm, eps=eps)
        self.layers = nn.ModuleList(
            post_norm_layer(
                config,
                backend_cls,
                eps,
                head_norm=norm,
                qk_norm_width="projection",
                sliding_window=window,
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.set_rotary(config)

    def set_rotary(self, config: Any) -> None:
        self.rotary = rotary_from_config(config, self.head_dim)


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    def set_rotary(self, config: Any) -> None:
        """The full-attention layers' rotary and the window layers' (`rope_parameters` by
        layer type)."""
        params = config.rope_parameters
        self.rotary = rotary_from_params(config, self.head_dim, params["full_attention"])
        self.local_rotary: RotaryEmbedding = rotary_from_params(
            config, self.head_dim, params["sliding_attention"]
        )

    def layer_angles(self, positions: torch.Tensor) -> list[RopeAngles]:
        return self.local_and_global_angles(positions)
