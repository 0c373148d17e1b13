"""The gated MLP of most decoders: down(act(x Wg^T) * (x Wu^T)), gate and up in one product."""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.services.gpu_worker.layers.activation import activation_and_mul
from pagedserve.services.gpu_worker.layers.linear import (
    MergedColumnParallelLinear,
    RowParallelLinear,
)


class GatedMLP(nn.Module):
    """`reduce_results=False`: each rank returns its partial sum, for a caller that reduces
    it with others (see `RowParallelLinear`)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        bias: bool = False,
        reduce_results: bool = True,
    ) -> None:
        super().__init__()
        self.reduce_results = reduce_results
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, reduce_results=reduce_results
        )
        self.act_and_mul = activation_and_mul(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.down_proj(self.gate_up_proj.act_and_mul(x, self.act_and_mul))
