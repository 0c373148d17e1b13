"""Activation-and-multiply ops of gated MLPs: act(first half) * second half."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.services.gpu_worker.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    def forward_native(self, x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(CustomOp):
    """GeGLU; `approximate` is "tanh" for `gelu_pytorch_tanh` (Gemma), "none" for `gelu`."""

    def __init__(self, approximate: str = "none", form: str | None = None) -> None:
        super().__init__(form)
        self.approximate = approximate

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


class ClampedSwigluAndMul(CustomOp):
    """GPT-OSS's experts: the gate clamped above at `limit`, the up projection to
    [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate). The checkpoint interleaves
    gate and up columns; they are split into the two halves at load like every gated MLP's."""

    def __init__(self, alpha: float = 1.702, limit: float = 7.0, form: str | None = None) -> None:
        super().__init__(form)
        self.alpha = alpha
        self.limit = limit

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


# config `hidden_act` -> (op class, its arguments)
_ACTIVATIONS: dict[str, tuple[type[CustomOp], dict[str, str]]] = {
    "silu": (SiluAndMul, {}),
    "swish": (SiluAndMul, {}),
    "gelu": (GeluAndMul, {"approximate": "none"}),
    "gelu_pytorch_tanh": (GeluAndMul, {"approximate": "tanh"}),
    "gelu_new": (GeluAndMul, {"approximate": "tanh"}),
}


def activation_and_mul(hidden_act: str) -> CustomOp:
    """The op for a config's `hidden_act`; an unsupported one is refused naming it."""
    if hidden_act not in _ACTIVATIONS:
        raise ValueError(
            f"hidden_act {hidden_act!r} is not supported (supported: {sorted(_ACTIVATIONS)})"
        )
    op_cls, kwargs = _ACTIVATIONS[hidden_act]
    return op_cls(**kwargs)
