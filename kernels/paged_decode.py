"""Triton kernels: decode attention, one new query token per sequence over its paged context.

Each program owns one (sequence, KV head) pair and the whole group of query heads that share
that KV head (GQA), so each KV tile is loaded once per group and the group forms the M
dimension of tl.dot (padded to 16 rows). When the batch is too small to fill the GPU, the
context is split across programs (flash-decoding): each split writes its normalised partial
output and log-sum-exp, and `paged_decode_reduce_kernel` merges them.
With attention sinks (SINKS, GPT-OSS), each head's logit joins the softmax's denominator at
the end: in the single pass as the output is normalised, with splits in the reduce (the
partials stay normalised over their own keys).
Twin: `kernels.reference.paged_decode_attention`."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pagedserve.kernels.attention_tile import (
    attend_kv_range,
    normalised_with_sinks,
    window_start,
)
from pagedserve.kernels.launch_checks import (
    MIN_DOT_DIM,
    check_cache,
    check_device,
    check_index,
    check_query,
    checked_sinks,
    decode_num_warps,
    next_power_of_2,
    num_multiprocessors,
    output_like,
    tile_size,
    upcast_for_dot,
)

LOG2_E = 1.4426950408889634
# Tokens per KV tile for the split heuristic: a few pages per iteration, and at least one
# page (`launch_checks.tile_size` sets the kernel's; smaller for fp32 on CUDA).
TILE_TOKENS = 64
# Split only when fewer programs than this many per SM would run, and keep each split at
# least this many tiles long so the reduce stays cheap next to the main pass.
PROGRAMS_PER_SM = 2
MIN_TILES_PER_SPLIT = 4
MAX_SPLITS = 32


# Values that change from step to step are not specialised on (Triton would otherwise compile
# a variant per divisibility class), so the kernels warmed up before serving are the ones that
# serve. `block_tables` rows are as wide as the step's longest sequence needs.
@triton.jit(do_not_specialize=["tiles_per_split", "stride_bt"])
def paged_decode_kernel(
    out_ptr,  # [B, Hq, D]; with SPLIT: partial outputs [B, Hq, S, D] fp32
    lse_ptr,  # with SPLIT: [B, Hq, S] fp32, log2-sum-exp2 of each split; else unused
    query_ptr,  # [B, Hq, D], stride 1 in D
    k_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    v_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    block_tables_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32, >= 1
    sinks_ptr,  # SINKS: [Hq] sink logits (natural log); else unused
    scale_log2,  # softmax scale * log2(e): scores live in the exp2 domain
    window,  # WINDOWED: the new token sees its last `window` keys, itself included
    softcap_log2,  # SOFTCAP: the logit soft-cap * log2(e)
    tiles_per_split,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_kn,
    stride_kb,
    stride_kh,
    stride_vn,
    stride_vb,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    kv_start = 0
    kv_end = seq_len
    if SPLIT:
        kv_start = split * tiles_per_split * TILE_N
        kv_end = tl.minimum(kv_start + tiles_per_split * TILE_N, seq_len)
    if WINDOWED:  # tiles wholly before the window are not read (a split may then be empty)
        kv_start = tl.maximum(kv_start, window_start(seq_len - 1, window))

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_PAD)
    heads = kv_head * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(
        query_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=q_mask,
        other=0.0,
    )
    table_ptr = block_tables_ptr + seq * stride_bt

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    q_pos = tl.zeros([GROUP_PAD], dtype=tl.int32) + seq_len - 1  # every row: the new token
    m_i, l_i, acc = attend_kv_range(
        q,
        q_pos,  # read for the window only: no causal mask, the new token is the last
        m_i,
        l_i,
        acc,
        k_cache_ptr,
        v_cache_ptr,
        table_ptr,
        kv_head,
        kv_start,
        kv_end,
        scale_log2,
        window,
        softcap_log2,
        stride_kn,
        stride_kb,
        stride_kh,
        stride_vn,
        stride_vb,
        stride_vh,
        False,
        WINDOWED,
        SOFTCAP,
        BLOCK_SIZE,
        HEAD_DIM,
        HEAD_PAD,
        TILE_N,
        UPCAST,
    )

    if SPLIT:
        # A split past the end of a short sequence saw no keys: output 0 with weight 0.
        has_keys = l_i > 0
        out = tl.where(has_keys[:, None], acc / tl.where(has_keys, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + split * stride_os
        tl.store(out_ptrs + d[None, :], out, mask=q_mask)
        lse_ptrs = lse_ptr + seq * stride_lb + heads * stride_lh + split
        tl.store(lse_ptrs, lse, mask=g < GROUP)
    else:
        if SINKS:
            sinks = tl.load(sinks_ptr + heads, mask=g < GROUP, other=0.0).to(tl.float32)
            sinks = sinks * 1.4426950408889634  # log2(e): scores live in the exp2 domain
            out = normalised_with_sinks(acc, m_i, l_i, sinks)
        else:
            out = acc / l_i[:, None]
        out_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit(do_not_specialize=["num_splits"])
def paged_decode_reduce_kernel(
    out_ptr,  # [B, Hq, D]
    partial_ptr,  # [B, Hq, S, D] fp32, contiguous
    lse_ptr,  # [B, Hq, S] fp32, contiguous; -inf for splits without keys
    sinks_ptr,  # SINKS: [Hq] sink logits (natural log); else unused
    stride_ob,
    stride_oh,
    num_splits,  # S: a runtime value, so one compiled variant serves every S up to SPLITS_PAD
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SINKS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_PAD)
    row = seq * num_heads + head
    lse = tl.load(lse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
    # The split holding the new token always holds keys, so the max is finite.
    m = tl.max(lse, 0)
    if SINKS:  # the head's sink logit joins the denominator once, over all splits
        sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    weights = tl.exp2(lse - m)  # [SPLITS_PAD]
    denominator = tl.sum(weights, 0)
    if SINKS:
        denominator += tl.exp2(sink - m)
    mask = (s[:, None] < num_splits) & (d[None, :] < HEAD_DIM)
    partial_ptrs = partial_ptr + (row * num_splits + s[:, None]) * HEAD_DIM + d[None, :]
    partial = tl.load(partial_ptrs, mask=mask, other=0.0)  # [SPLITS_PAD, HEAD_PAD]
    out = tl.sum(partial * weights[:, None], 0) / denominator
    out_ptrs = out_ptr + seq * stride_ob + head * stride_oh + d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Flash-decoding heuristic: split the context only when (sequence, KV head) programs
    alone would leave SMs idle, and only as far as each split keeps MIN_TILES_PER_SPLIT
    tiles of work."""
    num_programs = num_seqs * num_kv_heads
    target = num_sms * PROGRAMS_PER_SM
    if num_programs >= target:
        return 1
    num_tiles = math.ceil(max_seq_len / TILE_TOKENS)
    by_work = num_tiles // MIN_TILES_PER_SPLIT
    by_occupancy = math.ceil(target / num_programs)
    return max(1, min(by_work, by_occupancy, MAX_SPLITS))


def split_buffers(
    num_seqs: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [B, Hq, S, D] and log2-sum-exp2 [B, Hq, S], fp32, contiguous; every
    element is written by the split pass."""
    partial = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=device)
    lse = torch.empty(num_seqs, num_heads, num_splits, device=device)
    return partial, lse


def main_pass_targets(
    out: torch.Tensor, num_splits: int, tile_n: int, max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], tuple[int, ...], int]:
    """Where the main pass writes: (its output, the log-sum-exps, their strides, tiles per
    split): the split buffers with num_splits > 1, else `out` itself (lse unused)."""
    if num_splits == 1:
        return out, out, (*out.stride()[:2], 0), (0, 0), 0
    tiles_per_split = max(1, math.ceil(math.ceil(max_seq_len / tile_n) / num_splits))
    num_seqs, num_heads, head_dim = out.shape
    partial, lse = split_buffers(num_seqs, num_heads, num_splits, head_dim, out.device)
    return partial, lse, partial.stride()[:3], lse.stride()[:2], tiles_per_split


def check_decode_args(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    check_device(query, k_cache, v_cache, block_tables, seq_lens)
    check_cache(k_cache, v_cache)
    check_query(query, k_cache)
    check_index("block_tables", block_tables, 2, (torch.int32,))
    check_index("seq_lens", seq_lens, 1, (torch.int32,))
    num_seqs = query.shape[0]
    if block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables rows {block_tables.shape[0]} and seq_lens {seq_lens.shape[0]} must "
            f"equal the number of sequences {num_seqs}"
        )
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous in its last dim")


def auto_num_splits(query: torch.Tensor, num_kv_heads: int, max_seq_len: int) -> int:
    """`choose_num_splits` for this query's batch on its device."""
    num_sms = num_multiprocessors(query.device)
    return choose_num_splits(query.shape[0], num_kv_heads, max_seq_len, num_sms)


def paged_decode_attention(
    query: torch.Tensor,  # [B, Hq, D], one new token per sequence
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, >= 1, including the new token
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head (GPT-OSS)
) -> torch.Tensor:  # [B, Hq, D]
    """Attention of each sequence's newest token over its cached context (its last
    `sliding_window` keys, scores capped by `softcap`, each head's `sinks` logit in the
    softmax's denominator, when given: see `kernels.reference`).
    `num_splits`: None chooses by `choose_num_splits`; 1 forces the single pass; > 1 forces
    flash-decoding with that many splits. `max_seq_len` (an upper bound on seq_lens) saves the
    device sync the heuristic otherwise needs; an understated one drops keys from splits.
    `out`, if given, receives the result. seq_lens must be >= 1 and fit the block table (not
    checked on device: that would sync)."""
    check_decode_args(query, k_cache, v_cache, block_tables, seq_lens)
    sinks_checked = checked_sinks(sinks, query)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    (num_seqs, num_heads, head_dim), (num_kv_heads, block_size) = query.shape, k_cache.shape[2:0:-1]
    out = output_like(query, out)
    if num_seqs == 0:
        return out
    if num_splits != 1 and max_seq_len is None:
        max_seq_len = int(seq_lens.max())  # a device sync; callers that know it pass it
    num_splits = num_splits or auto_num_splits(query, num_kv_heads, max_seq_len)
    group = num_heads // num_kv_heads
    tile_n = max(tile_size(query.dtype, query.device), block_size)
    split = num_splits > 1
    target, lse, target_strides, lse_strides, tiles_per_split = main_pass_targets(
        out, num_splits, tile_n, max_seq_len or 0
    )
    paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        target, lse, query, k_cache, v_cache, block_tables, seq_lens,
        query if sinks_checked is None else sinks_checked, scale * LOG2_E,
        sliding_window or 0, (softcap or 1.0) * LOG2_E, tiles_per_split, *query.stride()[:2], *target_strides, *lse_strides,
        *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        GROUP=group, GROUP_PAD=max(MIN_DOT_DIM, next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_PAD=max(MIN_DOT_DIM, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, TILE_N=tile_n, SPLIT=split, UPCAST=upcast_for_dot(query),
        WINDOWED=sliding_window is not None, SOFTCAP=softcap is not None,
        SINKS=sinks_checked is not None, num_warps=decode_num_warps(query.dtype, query.device),
    )  # fmt: skip
    if split:
        paged_decode_reduce_kernel[(num_seqs, num_heads)](
            out, target, lse, lse if sinks_checked is None else sinks_checked, *out.stride()[:2],
            num_splits, SPLITS_PAD=next_power_of_2(num_splits), HEAD_DIM=head_dim,
            HEAD_PAD=next_power_of_2(head_dim), SINKS=sinks_checked is not None,
        )  # fmt: skip
    return out
