"""How a linear layer's weight is stored and multiplied (vLLM's `LinearMethod`).

A layer owns its plain weight (tensor-parallel loading, a tied embedding and anything that
reads parameters see it) and delegates the product to its method. `PlainLinear` is
`F.linear`; a platform may swap in its own after the weights load (the CPU packs them, see
`platforms/cpu_prepack.py`); a quantized method would store its own tensors the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F


class BaseLinearMethod(ABC):
    @abstractmethod
    def apply(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x W^T (+ b) for `weight` [out, in], the layer's plain weight."""

    def apply_silu_and_mul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """silu(x Wg^T) * (x Wu^T) for a merged [gate; up] weight in one pass where the method
        has such a pass for these rows; None: the caller multiplies and then activates."""
        return None


class PlainLinear(BaseLinearMethod):
    def apply(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x, weight, bias)


PLAIN_LINEAR = PlainLinear()
