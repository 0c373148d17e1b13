"""Triton kernel: prefill/extend attention. Each sequence brings a chunk of new query tokens,
packed by `query_start_loc`, that attend causally over its cached paged prefix and
themselves. A decode is a chunk of one token, so a mixed batch is one launch.

A program owns (sequence, tile of BLOCK_Q query tokens, KV head); its M dimension holds the
BLOCK_Q tokens times the GROUP query heads sharing that KV head (row = token * GROUP_PAD +
head in group), so each KV tile is loaded once per group. The KV loop stops at the tile's
last query position, so causal work beyond the diagonal is never loaded.
Twin: `kernels.reference.paged_prefill_attention`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention_tile import (
    load_kv_tile,
    online_softmax_step,
    tile_scores,
    tile_weighted_values,
)
from kernels.launch_checks import (
    MIN_DOT_DIM,
    check_cache,
    check_device,
    check_index,
    check_query,
    next_power_of_2,
    output_like,
    upcast_for_dot,
)

LOG2_E = 1.4426950408889634
# Rows (query tokens x group heads) per program, and KV tokens per inner iteration.
ROWS_PER_PROGRAM = 64
TILE_TOKENS = 64


@triton.jit
def paged_prefill_kernel(
    out_ptr,  # [T, Hq, D]
    query_ptr,  # [T, Hq, D], stride 1 in D, packed by query_start_loc
    k_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    v_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    block_tables_ptr,  # [B, max_blocks] int32
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32: cached prefix + new tokens
    scale_log2,  # softmax scale * log2(e): scores live in the exp2 domain
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    # The grid is sized for the longest chunk; shorter chunks leave programs with no rows.
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    q_idx = q_tile * BLOCK_Q + rows // GROUP_PAD  # [M] token index within the chunk
    g = rows % GROUP_PAD
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_PAD)
    row_valid = (q_idx < q_len) & (g < GROUP)
    q_mask = row_valid[:, None] & (d[None, :] < HEAD_DIM)
    tokens = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        query_ptr + tokens[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=q_mask,
        other=0.0,
    )
    q_pos = prefix_len + q_idx  # [M] context position of each row's token
    kv_end = tl.minimum(prefix_len + (q_tile + 1) * BLOCK_Q, seq_len)
    table_ptr = block_tables_ptr + seq * stride_bt

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    n = tl.arange(0, TILE_N)
    for tile_start in range(0, kv_end, TILE_N):
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
        causal = valid[None, :] & (positions[None, :] <= q_pos[:, None])
        scores = tl.where(causal, scores, float("-inf"))
        # Position 0 is in the first tile and visible to every row, so m_i is finite from
        # then on and a row fully masked in a later tile just adds zeros.
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

    out = acc / l_i[:, None]
    out_ptrs = out_ptr + tokens[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def check_prefill_args(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    check_device(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    check_cache(k_cache, v_cache)
    check_query(query, k_cache)
    check_index("block_tables", block_tables, 2, (torch.int32,))
    check_index("query_start_loc", query_start_loc, 1, (torch.int32,))
    check_index("seq_lens", seq_lens, 1, (torch.int32,))
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(
            f"block_tables rows {block_tables.shape[0]} must equal num_seqs {num_seqs} and "
            f"query_start_loc length {query_start_loc.shape[0]} must be num_seqs + 1"
        )
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous in its last dim")


def choose_block_q(group: int) -> tuple[int, int]:
    """(BLOCK_Q, GROUP_PAD): query tokens per program and padded group, with
    BLOCK_Q * GROUP_PAD = max(ROWS_PER_PROGRAM, GROUP_PAD) rows."""
    group_pad = next_power_of_2(group)
    block_q = max(1, ROWS_PER_PROGRAM // group_pad)
    if block_q * group_pad < MIN_DOT_DIM:
        group_pad = MIN_DOT_DIM // block_q
    return block_q, group_pad


def paged_prefill_attention(
    query: torch.Tensor,  # [T, Hq, D], the new tokens of every sequence, packed
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, cached prefix + new tokens
    scale: float,
    *,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    """Causal attention of a chunk of new tokens over a cached paged prefix plus themselves.
    A decode is the case of one new token, so a mixed batch goes through here whole. The new
    tokens' keys and values must already be in the cache. `max_query_len` (the longest chunk)
    saves the device sync that sizing the grid otherwise needs; `out`, if given, receives
    the result."""
    check_prefill_args(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    out = output_like(query, out)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out
    group = num_heads // num_kv_heads
    block_q, group_pad = choose_block_q(group)
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    paged_prefill_kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale * LOG2_E,
        *query.stride()[:2],
        *out.stride()[:2],
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        HEAD_PAD=max(MIN_DOT_DIM, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        TILE_N=max(TILE_TOKENS, block_size),
        UPCAST=upcast_for_dot(query),
    )
    return out
