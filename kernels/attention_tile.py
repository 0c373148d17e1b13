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
def online_softmax_step(scores, m_i, l_i, MAY_BE_EMPTY: tl.constexpr):
    """One tile of the streaming (flash) softmax over base-2 scores [ROWS, TILE_N]: the new
    running max and sum per row, the tile's unnormalised weights, and `alpha`, the factor
    that rescales what was accumulated before this tile. MAY_BE_EMPTY: a row may have seen
    no visible key yet (a sliding window starts after the tile), and then adds nothing."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_ref = m_new
    if MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, p, alpha


@triton.jit
def soft_capped(scores, softcap_log2):
    """Base-2 scores s' = s log2(e) capped as c tanh(s / c) of the natural ones: with
    c' = c log2(e), c' tanh(s' / c'). tanh(x) = 1 - 2 / (exp(2x) + 1), which saturates
    cleanly (an overflow gives 1)."""
    x = scores / softcap_log2
    return softcap_log2 * (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0))


@triton.jit
def normalised_with_sinks(acc, m_i, l_i, sinks_log2):
    """The output rows acc / (l_i + 2^(sink - m_i)): each row's sink logit (base 2, GPT-OSS)
    joins the softmax's denominator as a key with no value, rescaled to the larger of the
    running max and the sink so that neither overflows."""
    m = tl.maximum(m_i, sinks_log2)
    kept = tl.exp2(m_i - m)
    return acc * (kept / (l_i * kept + tl.exp2(sinks_log2 - m)))[:, None]


@triton.jit
def window_start(first_q_pos, window):
    """The first position a query at `first_q_pos` sees in a window of `window` keys."""
    return tl.maximum(first_q_pos - window + 1, 0)


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
    kv_start,  # first context position to read (tiles start at the multiple of TILE_N below)
    kv_end,  # one past the last
    scale_log2,
    window,  # a sliding window's keys (WINDOWED): a row at p sees p - window < k <= p
    softcap_log2,  # logit soft-cap times log2(e) (SOFTCAP)
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The KV-tile loop both attention kernels run: stream the keys and values of context
    positions [kv_start, kv_end) through the online softmax, masking positions past a row's
    own when CAUSAL and those before a row's window when WINDOWED (`q_pos` then gives the rows'
    positions), soft-capping the scores when SOFTCAP. Returns the updated (m_i, l_i, acc).
    Inlined by Triton, so sharing it costs the kernels nothing."""
    n = tl.arange(0, TILE_N)
    for tile_start in range(kv_start - kv_start % TILE_N, kv_end, TILE_N):
        positions = tile_start + n
        # positions before kv_start may be in blocks given back (a window's): never loaded
        valid = (positions >= kv_start) & (positions < kv_end)
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
        if SOFTCAP:
            scores = soft_capped(scores, softcap_log2)
        if CAUSAL:
            visible = valid[None, :] & (positions[None, :] <= q_pos[:, None])
        else:
            visible = valid[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        if WINDOWED:  # a separate mask: `visible` is [1, TILE_N] without CAUSAL
            in_window = positions[None, :] > q_pos[:, None] - window
            scores = tl.where(in_window, scores, float("-inf"))
        # Decode: every tile holds >= 1 valid position. Prefill: position 0 is in the first
        # tile and visible to every row. Either way m_new is finite from the first tile on,
        # and a row fully masked in a later tile just adds zeros. A window breaks both: a row
        # may see nothing in a tile before its window.
        m_new, l_i, p, alpha = online_softmax_step(scores, m_i, l_i, WINDOWED)
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
