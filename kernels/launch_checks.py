"""Argument checks and launch choices shared by the kernel wrappers.

The wrappers check shapes, dtypes and devices on the host before launching, because a Triton
kernel given a wrong layout reads out of bounds silently instead of raising."""

from __future__ import annotations

import functools
import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# tl.dot needs every dimension of a tile >= 16 on NVIDIA GPUs; tl.arange needs powers of two.
MIN_DOT_DIM = 16
# KV tokens per tile, and query rows per prefill program. fp32 operands on a GPU (--dtype
# float32) take twice the registers of fp16/bf16 ones: with 64 x 64 tiles at head_dim 128 the
# fp32 prefill spills 7-10 KB per thread to local memory and the fp32 decode spills on sm_80
# (cuobjdump -res-usage of sm_80 and sm_90 builds), so fp32 on CUDA uses 32 x 32 tiles, which
# fit in registers. See docs/ARCHITECTURE.md, "Register pressure".
WIDE_TILE = 64
FP32_CUDA_TILE = 32


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device; a CPU device only under the Triton interpreter."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = next(iter(devices))
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before kernels are "
            "imported; use kernels.reference for the CPU serving path"
        )


def check_dtype(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"{name} dtype must be one of float32, float16, bfloat16, got {tensor.dtype}"
        )


def check_index(
    name: str, tensor: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...]
) -> None:
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {dtypes}, got {tensor.dtype}")


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """K and V caches [num_blocks, block_size, num_kv_heads, head_dim], same shape and dtype,
    contiguous in head_dim, block size a power of two >= 16."""
    if k_cache.dim() != 4:
        raise ValueError(
            f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {tuple(k_cache.shape)}"
        )
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache "
            f"{tuple(v_cache.shape)} {v_cache.dtype} must match"
        )
    check_dtype("k_cache", k_cache)
    block_size = k_cache.shape[1]
    if block_size < MIN_DOT_DIM or block_size != next_power_of_2(block_size):
        raise ValueError(f"block_size must be a power of two >= {MIN_DOT_DIM}, got {block_size}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in head_dim (stride 1)")


def check_query(query: torch.Tensor, k_cache: torch.Tensor) -> None:
    """query [tokens, num_heads, head_dim] matching the cache's head_dim and dtype, with
    num_heads a multiple of num_kv_heads."""
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, num_heads, head_dim], got {tuple(query.shape)}")
    check_dtype("query", query)
    if query.dtype != k_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} must match the cache dtype {k_cache.dtype}")
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, cache_head_dim = k_cache.shape[2], k_cache.shape[3]
    if head_dim != cache_head_dim:
        raise ValueError(f"query head_dim {head_dim} != cache head_dim {cache_head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    if query.stride(2) != 1:
        raise ValueError("query must be contiguous in head_dim (stride 1)")


def upcast_for_dot(tensor: torch.Tensor) -> bool:
    """Whether the kernels compute tl.dot in fp32. Always on the CPU interpreter, whose bf16
    dot returns garbage in Triton 3.9; for fp32 data, so that no TF32 rounding happens on GPU.
    On GPU, fp16/bf16 use the tensor cores with fp32 accumulation."""
    return tensor.device.type == "cpu" or tensor.dtype == torch.float32


def tile_size(dtype: torch.dtype, device: torch.device) -> int:
    """KV tokens per tile and query rows per prefill program: 32 for fp32 on CUDA, else 64."""
    return FP32_CUDA_TILE if device.type == "cuda" and dtype == torch.float32 else WIDE_TILE


def decode_num_warps(dtype: torch.dtype, device: torch.device) -> int:
    """Warps per decode program: 8 for fp32 on CUDA, whose split variant at 4 warps needs 255
    registers and spills (sm_90); 8 warps spread the tile and use about 50. Else Triton's 4."""
    return 8 if device.type == "cuda" and dtype == torch.float32 else 4


def num_multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device (1 elsewhere), for the split-K heuristic."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return cuda_multiprocessors(index)


@functools.cache
def cuda_multiprocessors(index: int) -> int:
    # Queried once per device: the decode wrapper asks on every call.
    return torch.cuda.get_device_properties(index).multi_processor_count


def output_like(query: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`out` checked against the query's shape, dtype and device, or a new tensor."""
    if out is None:
        return torch.empty_like(query)
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(
            f"out must be {tuple(query.shape)} {query.dtype} on {query.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if out.stride(2) != 1:
        raise ValueError("out must be contiguous in head_dim (stride 1)")
    return out


def checked_sinks(sinks: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """Attention sinks [num_heads], contiguous on the query's device, as the kernels read them
    (in any float dtype: they widen and scale by log2(e) in-kernel, so a call pays no extra
    launch); None: none."""
    if sinks is None:
        return None
    if sinks.shape != (query.shape[1],) or sinks.device != query.device:
        raise ValueError(
            f"sinks must be [num_heads={query.shape[1]}] on {query.device}, got "
            f"{tuple(sinks.shape)} on {sinks.device}"
        )
    if not sinks.is_contiguous() or not sinks.is_floating_point():
        raise ValueError(f"sinks must be contiguous floats, got {sinks.dtype}")
    return sinks
