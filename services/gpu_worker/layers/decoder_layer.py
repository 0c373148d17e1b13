"""The pre-norm decoder layer most architectures share (Llama, Qwen, Gemma, Granite):

    h = x + attn(norm1(x)) * m;   out = h + mlp(norm2(h)) * m      (m: Granite's multiplier)

The residual add is left to the next norm (`norm(x, residual)` adds first, in one C call on
the CPU), so a layer returns its branch's output and the running residual.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata
from pagedserve.services.gpu_worker.layers.attention import Attention
from pagedserve.services.gpu_worker.layers.rotary import RopeAngles


class PreNormDecoderLayer(nn.Module):
    selects_rows = True  # forward takes `keep`, see there

    def __init__(
        self,
        self_attn: Attention,
        mlp: nn.Module,
        input_layernorm: nn.Module,
        post_attention_layernorm: nn.Module,
        residual_multiplier: float | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm
        self.residual_multiplier = residual_multiplier

    def forward(
        self,
        angles: RopeAngles,
        hidden: torch.Tensor,  # [T, H] the previous layer's branch output (or the embeddings)
        residual: torch.Tensor | None,  # [T, H]; None in the first layer
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        keep: torch.Tensor | None = None,  # [R] rows past attention (see `select_rows`)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self._scaled(self.self_attn(angles, normed, kv_cache, metadata))
        hidden, residual = select_rows(keep, hidden, residual)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self._scaled(self.mlp(normed)), residual

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        if self.residual_multiplier is None:
            return branch
        return branch * self.residual_multiplier


def select_rows(
    keep: torch.Tensor | None, hidden: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows `keep` of a layer's attention output and residual (all of them for None). A
    model's last layer, once attention has cached every row's keys and values, needs to go on
    only with the rows whose logits the step reads (`DecoderLM.forward`)."""
    if keep is None:
        return hidden, residual
    return hidden[keep], residual[keep]


class SandwichDecoderLayer(nn.Module):
    """Gemma 2 and 3: each branch normed before and after,

    h = x + norm2(attn(norm1(x)));   out = h + norm4(mlp(norm3(h)))
    """

    selects_rows = True  # forward takes `keep`, see `select_rows`

    def __init__(self, self_attn: Attention, mlp: nn.Module, norm: type[nn.Module], size: int,
                 eps: float) -> None:  # fmt: skip
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = norm(size, eps)
        self.post_attention_layernorm = norm(size, eps)
        self.pre_feedforward_layernorm = norm(size, eps)
        self.post_feedforward_layernorm = norm(size, eps)

    def forward(
        self,
        angles: RopeAngles,
        hidden: torch.Tensor,  # [T, H] the previous layer's branch output (or the embeddings)
        residual: torch.Tensor | None,  # [T, H]; None in the first layer
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        keep: torch.Tensor | None = None,  # [R] rows past attention (see `select_rows`)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        attended, _ = self.post_attention_layernorm(
            self.self_attn(angles, normed, kv_cache, metadata)
        )
        attended, residual = select_rows(keep, attended, residual)
        normed, residual = self.pre_feedforward_layernorm(attended, residual)
        out, _ = self.post_feedforward_layernorm(self.mlp(normed))
        return out, residual
