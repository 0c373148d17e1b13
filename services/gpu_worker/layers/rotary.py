"""Rotary position embedding with the config's theta and rope scaling (`rope_scaling.py`).

The cos/sin table is precomputed for every position the model serves and indexed by position;
the rotation itself is an op with a CPU form (`ApplyRotary`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pagedserve.kernels import cpu_rotary
from pagedserve.services.gpu_worker.layers.custom_op import CustomOp
from pagedserve.services.gpu_worker.layers.rope_scaling import rope_angles


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        cos, sin = rope_angles(head_dim, max_position, theta, scaling)  # [P, D/2] each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def angles(self, positions: torch.Tensor) -> RopeAngles:
        """cos and sin at `positions`, [T, 1, D/2] each: the same for every layer, so a model
        takes them once per forward pass."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # q [T, Hq, D], k [T, Hkv, D]
        angles = self.angles(positions)
        return rotate(q, angles), rotate(k, angles)


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's rope scaling dict with its theta (transformers >= 5 keeps both in
    `rope_parameters`; older ones split `rope_theta` and `rope_scaling`)."""
    rope = dict(
        getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    )
    if "rope_theta" not in rope:
        rope["rope_theta"] = getattr(config, "rope_theta", None) or 10000.0
    original = getattr(config, "original_max_position_embeddings", None)
    if original is not None:  # Phi-3 keeps it beside the rope parameters
        rope.setdefault("original_max_position_embeddings", original)
    return rope


def rotary_from_config(config: Any, head_dim: int) -> RotaryEmbedding:
    return rotary_from_params(config, head_dim, rope_parameters(config))


def rotary_from_params(config: Any, head_dim: int, rope: dict[str, Any]) -> RotaryEmbedding:
    """The rotary embedding of one set of rope parameters (a model may have one per layer
    type)."""
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor {partial} is not supported (only 1.0)")
    return RotaryEmbedding(head_dim, config.max_position_embeddings, rope["rope_theta"], rope)


RopeAngles = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [T, 1, D/2]


def rotate(x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
    """x [T, H, D] rotated by its tokens' angles, in float32. Heads are independent, so the
    queries and keys of a layer may be rotated in one call."""
    cos, sin = angles
    # The "rotate half" convention of HF Llama checkpoints (not interleaved pairs).
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


class ApplyRotary(CustomOp):
    """Rotates x [T, H, D] by its tokens' angles and may write over x, so it is called on a
    tensor nobody else reads (a layer's fresh q/k projection). The CPU form is one C call
    (`kernels/cpu_rotary.c`, the same arithmetic) in place of ten small torch ops."""

    def forward_native(self, x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
        return rotate(x, angles)

    def forward_cpu(self, x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
        cos, sin = angles
        if cpu_rotary.supports(x, cos, sin):
            return cpu_rotary.rotate_in_place(x, cos, sin)
        return rotate(x, angles)
