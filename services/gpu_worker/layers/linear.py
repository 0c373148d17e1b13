"""Megatron-style linear layers. Each owns this rank's shard and a `weight_loader` that takes a
full checkpoint tensor and copies the rank's slice, so models know nothing of sharding.

Column-parallel splits the output features (no communication); row-parallel splits the input
features and all-reduces the partial sums. Attention's qkv and the MLP's gate/up are column
parallel, o_proj and down_proj row parallel: one all-reduce per block half.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.services.gpu_worker.layers.activation import SiluAndMul
from pagedserve.services.gpu_worker.layers.custom_op import CustomOp
from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR, BaseLinearMethod
from pagedserve.services.gpu_worker.parallel_state import (
    all_reduce,
    divide,
    get_tp_rank,
    get_tp_world_size,
)


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"weight {name}: checkpoint shard has shape {tuple(loaded.shape)}, "
            f"the model expects {tuple(param.shape)}"
        )
    param.data.copy_(loaded)


class ReplicatedLinear(nn.Module):
    """y = x W^T (+ b) with the whole W on every rank (MLA's down-projections)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.weight.weight_loader = self.weight_loader
        self.linear_method: BaseLinearMethod = PLAIN_LINEAR  # a platform may swap it
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        _copy_checked(param, loaded, "replicated weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(x, self.weight, self.bias)


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), W split by rows (output features) across ranks."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.input_size = input_size
        self.output_size_per_rank = divide(output_size, self.tp_size, "output features")
        self.weight = nn.Parameter(torch.empty(self.output_size_per_rank, input_size))
        self.weight.weight_loader = self.weight_loader
        self.linear_method: BaseLinearMethod = PLAIN_LINEAR  # a platform may swap it
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_rank))
            self.bias.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        size = param.shape[0]
        _copy_checked(param, loaded.narrow(0, self.tp_rank * size, size), "column shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_method.apply(x, self.weight, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up), each sharded separately."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = 0
    ) -> None:
        assert isinstance(shard_id, int)
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        shard = loaded.narrow(0, self.tp_rank * size, size)
        _copy_checked(param.data.narrow(0, offset, size), shard, f"merged part {shard_id}")

    def act_and_mul(self, x: torch.Tensor, act_and_mul: CustomOp) -> torch.Tensor:
        """act(first output) * second output (an MLP's merged gate and up): a SwiGLU in one
        pass where the linear method has one (no bias), else the product, then the op."""
        two_halves = len(self.output_sizes) == 2 and self.output_sizes[0] == self.output_sizes[1]
        if isinstance(act_and_mul, SiluAndMul) and two_halves and self.bias is None:
            fused = self.linear_method.apply_silu_and_mul(x, self.weight)
            if fused is not None:
                return fused
        return act_and_mul(self(x))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; each rank holds its heads of each. KV heads are
    replicated when there are fewer of them than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
    ) -> None:
        tp_size = get_tp_world_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp_size, "num_attention_heads")
        if num_kv_heads >= tp_size:
            self.num_kv_heads = divide(num_kv_heads, tp_size, "num_key_value_heads")
            self.num_kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.num_kv_replicas = divide(tp_size, num_kv_heads, "tensor_parallel_size")
        total = (num_heads + 2 * self.num_kv_heads * tp_size) * head_dim
        super().__init__(hidden_size, total, bias)

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = "q"
    ) -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, index = 0, q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, index = kv_size, self.tp_rank // self.num_kv_replicas
        else:
            raise ValueError(f"qkv shard id must be 'q', 'k' or 'v', got {shard_id!r}")
        shard = loaded.narrow(0, index * size, size)
        _copy_checked(param.data.narrow(0, offset, size), shard, f"qkv part {shard_id}")


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r W_r^T (+ b once), W split by columns (input features).
    With `reduce_results=False` each rank returns its partial sum (the bias on rank 0 only)
    for a caller that adds more partial sums and reduces them all at once (a MoE layer's
    shared expert, see `layers/fused_moe.py`)."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.reduce_results = reduce_results
        self.input_size_per_rank = divide(input_size, self.tp_size, "input features")
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_rank))
        self.weight.weight_loader = self.weight_loader
        self.linear_method: BaseLinearMethod = PLAIN_LINEAR  # a platform may swap it
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size))
            self.bias.weight_loader = self.bias_loader

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        size = param.shape[1]
        _copy_checked(param, loaded.narrow(1, self.tp_rank * size, size), "row shard")

    def bias_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        _copy_checked(param, loaded, "row bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:  # the bias inside the product, rounded once, as F.linear does
            return self.linear_method.apply(x, self.weight, self.bias)
        out = self.linear_method.apply(x, self.weight)
        if self.reduce_results:
            out = all_reduce(out)
        if self.bias is not None and (self.reduce_results or self.tp_rank == 0):
            out = out + self.bias
        return out
