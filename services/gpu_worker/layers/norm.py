"""RMSNorm, computed in float32 as Hugging Face's Llama does, with an optional fused residual.

The CPU form does the add and the norm in one C call (`kernels/cpu_rms_norm.c`) where the
kernel takes the tensors: as torch ops a decode step at small batch paid tens of microseconds
of dispatch per op, 2 x layers times. `GemmaRMSNorm` scales by (1 + w) and rounds as Gemma
does (the product in float32, then the input's dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels import cpu_rms_norm
from pagedserve.services.gpu_worker.layers.custom_op import CustomOp

NormOutput = tuple[torch.Tensor, torch.Tensor]  # (normed, new residual)


class RMSNorm(CustomOp):
    def __init__(self, hidden_size: int, eps: float = 1e-6, form: str | None = None) -> None:
        super().__init__(form)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 == self.weight.dtype:
            # The same arithmetic in one call (bit-identical; a call costs microseconds, and a
            # decode step at small batch pays it 2 x layers times).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> NormOutput:
        """Returns (normed, new residual); with `residual`, x is added to it first."""
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> NormOutput:
        if residual is None and not x.is_contiguous():
            # a view of heads in the qkv rows (Qwen3's q/k norms): a copy the kernel takes, so
            # the bits are those the fused forward gets norming them in place
            x = x.contiguous()
        if cpu_rms_norm.supports(x, self.weight, residual):
            return cpu_rms_norm.add_rms_norm(x, residual, self.weight, self.eps)
        return self.forward_native(x, residual)


class GemmaRMSNorm(CustomOp):
    """x / rms(x) * (1 + w), all in float32 and rounded once (Gemma's weights store w - 1)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, form: str | None = None) -> None:
        super().__init__(form)
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> NormOutput:
        if residual is not None:
            x = x + residual
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype), x
