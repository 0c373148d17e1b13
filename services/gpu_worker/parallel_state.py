"""Tensor-parallel process group: rank, world size and the few collectives the layers need.

With world size 1 nothing is initialised and every collective is the identity, so a single
process never touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(slots=True)
class _TensorParallelState:
    rank: int = 0
    world_size: int = 1


_STATE = _TensorParallelState()


def init_tensor_parallel(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29555,
    backend: str | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Join the tensor-parallel group: NCCL on CUDA, gloo on CPU unless `backend` says."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    _STATE.rank, _STATE.world_size = rank, world_size
    if world_size == 1 or dist.is_initialized():
        return
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def destroy_tensor_parallel() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    _STATE.rank, _STATE.world_size = 0, 1


def get_tp_rank() -> int:
    return _STATE.rank


def get_tp_world_size() -> int:
    return _STATE.world_size


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place (the row-parallel output)."""
    if _STATE.world_size > 1:
        dist.all_reduce(tensor)
    return tensor


def gather_last_dim_to_rank0(tensor: torch.Tensor) -> torch.Tensor | None:
    """Concatenate every rank's shard along the last dim on rank 0; other ranks get None."""
    if _STATE.world_size == 1:
        return tensor
    tensor = tensor.contiguous()
    if _STATE.rank == 0:
        shards = [torch.empty_like(tensor) for _ in range(_STATE.world_size)]
        dist.gather(tensor, shards, dst=0)
        return torch.cat(shards, dim=-1)
    dist.gather(tensor, None, dst=0)
    return None


def all_gather_last_dim(tensor: torch.Tensor) -> torch.Tensor:
    if _STATE.world_size == 1:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(_STATE.world_size)]
    dist.all_gather(shards, tensor.contiguous())
    return torch.cat(shards, dim=-1)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what} ({numerator}) must be divisible by tensor_parallel_size ({denominator})"
        )
    return numerator // denominator
