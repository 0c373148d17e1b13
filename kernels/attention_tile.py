"""Triton device functions shared by the paged attention kernels: gather one tile of cached
keys or values through a block table, and the two matmuls of attention with the dtype policy
of `launch_checks.upcast_for_dot`."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    block_table_ptr,  # [max_blocks] int32: this sequence's row of the block table
    positions,  # [TILE_N] int: context positions of the tile's tokens
    valid,  # [TILE_N] bool: positions < the sequence's key bound
    kv_head,
    stride_n,
    stride_b,
    stride_h,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    # A tile may span several pages, so block ids are gathered per token: the tile size is
    # then free of the page size and one iteration moves enough bytes to hide latency.
    block_ids = tl.load(block_table_ptr + positions // BLOCK_SIZE, mask=valid, other=0)
    offsets = block_ids.to(tl.int64) * stride_n + (positions % BLOCK_SIZE) * stride_b
    d = tl.arange(0, HEAD_PAD)
    ptrs = cache_ptr + offsets[:, None] + kv_head * stride_h + d[None, :]
    return tl.load(ptrs, mask=valid[:, None] & (d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def tile_scores(q, k, UPCAST: tl.constexpr):
    """q [M, D] x k [N, D] -> [M, N] fp32."""
    if UPCAST:
        scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    return scores


@triton.jit
def tile_weighted_values(p, v, UPCAST: tl.constexpr):
    """p [M, N] fp32 x v [N, D] -> [M, D] fp32."""
    if UPCAST:
        out = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(p.to(v.dtype), v)
    return out


@triton.jit
def online_softmax_step(scores, m_i, l_i):
    """One tile of the streaming (flash) softmax over base-2 scores [ROWS, TILE_N]: the new
    running max and sum per row, the tile's unnormalised weights, and `alpha`, the factor
    that rescales what was accumulated before this tile."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, p, alpha


@triton.jit
def attend_kv_range(
    q,  # [M, HEAD_PAD] this program's query rows
    q_pos,  # [M] int: each row's context position (read only when CAUSAL)
    m_i,  # [M] fp32 running max (exp2 domain)
    l_i,  # [M] fp32 running sum
    acc,  # [M, HEAD_PAD] fp32 unnormalised output
    k_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    v_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    table_ptr,  # [max_blocks] int32: this sequence's row of the block table
    kv_head,
    kv_start,  # first context position to attend, a multiple of TILE_N
    kv_end,  # one past the last
    scale_log2,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    CAUSAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The KV-tile loop both attention kernels run: stream the keys and values of context
    positions [kv_start, kv_end) through the online softmax, masking positions past a row's
    own when CAUSAL. Returns the updated (m_i, l_i, acc). Inlined by Triton, so sharing it
    costs the kernels nothing."""
    n = tl.arange(0, TILE_N)
    for tile_start in range(kv_start, kv_end, TILE_N):
        positions = tile_start + n
        valid = positions < kv_end
        k = load_kv_tile(
            k_cache_ptr,
            table_ptr,
            positions,
            valid,
            kv_head,
            stride_kn,
            stride_kb,
            stride_kh,
            BLOCK_SIZE,
            HEAD_DIM,
            HEAD_PAD,
        )
        scores = tile_scores(q, k, UPCAST) * scale_log2  # [M, TILE_N]
        if CAUSAL:
            visible = valid[None, :] & (positions[None, :] <= q_pos[:, None])
        else:
            visible = valid[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        # Decode: every tile holds >= 1 valid position. Prefill: position 0 is in the first
        # tile and visible to every row. Either way m_new is finite from the first tile on,
        # and a row fully masked in a later tile just adds zeros.
        m_new, l_i, p, alpha = online_softmax_step(scores, m_i, l_i)
        v = load_kv_tile(
            v_cache_ptr,
            table_ptr,
            positions,
            valid,
            kv_head,
            stride_vn,
            stride_vb,
            stride_vh,
            BLOCK_SIZE,
            HEAD_DIM,
            HEAD_PAD,
        )
        acc = acc * alpha[:, None] + tile_weighted_values(p, v, UPCAST)
        m_i = m_new
    return m_i, l_i, acc
