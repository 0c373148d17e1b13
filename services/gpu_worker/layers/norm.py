"""RMSNorm, computed in float32 as Hugging Face's Llama does, with an optional fused residual.

On the CPU the add and the norm are one C call (`kernels/cpu_rms_norm.c`): as torch ops a
decode step at small batch paid tens of microseconds of dispatch per op, 2 x layers times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels import cpu_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
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

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (normed, new residual); with `residual`, x is added to it first."""
        if cpu_rms_norm.supports(x, self.weight, residual):
            return cpu_rms_norm.add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        return self._norm(x), x
