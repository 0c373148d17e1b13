"""Triton kernel: store new keys and values into the paged KV cache through `slot_mapping`.
Twin: `kernels.reference.write_kv_cache`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedserve.kernels.launch_checks import check_cache, check_device, check_index, next_power_of_2


@triton.jit
def kv_cache_write_kernel(
    key_ptr,  # [T, Hkv, D], stride 1 in D
    value_ptr,  # [T, Hkv, D], stride 1 in D
    k_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    v_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    slot_mapping_ptr,  # [T] int64; slot = block_id * BS + offset; -1: skip
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcn,
    stride_kcb,
    stride_kch,
    stride_vcn,
    stride_vcb,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # One program per token: all of its KV heads at once, one contiguous row per head.
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HEAD_PAD)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(key_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    k_dst = k_cache_ptr + block_id * stride_kcn + offset * stride_kcb
    v_dst = v_cache_ptr + block_id * stride_vcn + offset * stride_vcb
    tl.store(
        k_dst + h[:, None] * stride_kch + d[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=mask
    )
    tl.store(
        v_dst + h[:, None] * stride_vch + d[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask
    )


def write_kv_cache(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Store each token's key and value at its slot; tokens with slot -1 are skipped.
    Slots must be < num_blocks * block_size (not checked on device: that would sync)."""
    check_device(key, value, k_cache, v_cache, slot_mapping)
    check_cache(k_cache, v_cache)
    check_index("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32))
    expected = (slot_mapping.shape[0], k_cache.shape[2], k_cache.shape[3])
    for name, tensor in (("key", key), ("value", value)):
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{name} must be [T, Hkv, D] = {expected}, got {tuple(tensor.shape)}")
        if tensor.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1)")
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    kv_cache_write_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_PAD=next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )
