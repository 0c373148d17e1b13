"""Triton kernel: prefill/extend attention. Each sequence brings a chunk of new query tokens,
packed by `query_start_loc`, that attend causally over its cached paged prefix and
themselves. A decode is a chunk of one token, so a mixed batch is one launch.

A program owns (sequence, tile of BLOCK_Q query tokens, KV head); its M dimension holds the
BLOCK_Q tokens times the GROUP query heads sharing that KV head (row = token * GROUP_PAD +
head in group), so each KV tile is loaded once per group. The KV loop stops at the tile's
last query position, so causal work beyond the diagonal is never loaded.

The grid is a flat list of the (sequence, query tile) pairs that exist, built on the host
(`build_work_items`): a mixed step of one long chunk beside many decodes launches one program
per tile, not (sequences x tiles of the longest chunk) of which almost all would exit at once.
With attention sinks (SINKS, GPT-OSS), each row's head logit joins the softmax's denominator
as the output is normalised. Twin: `kernels.reference.paged_prefill_attention`."""

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
    next_power_of_2,
    output_like,
    tile_size,
    upcast_for_dot,
)

LOG2_E = 1.4426950408889634
# "flat": one program per query tile that exists; "padded": the (sequences x tiles of the
# longest chunk) grid this kernel had first, kept selectable to measure the difference.
PREFILL_GRIDS = ("flat", "padded")


# `block_tables` rows are as wide as the step's longest sequence needs: not specialised on, so
# one compiled variant serves every step (see `paged_decode`).
@triton.jit(do_not_specialize=["stride_bt"])
def paged_prefill_kernel(
    out_ptr,  # [T, Hq, D]
    query_ptr,  # [T, Hq, D], stride 1 in D, packed by query_start_loc
    k_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    v_cache_ptr,  # [N, BS, Hkv, D], stride 1 in D
    block_tables_ptr,  # [B, max_blocks] int32
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32: cached prefix + new tokens
    work_items_ptr,  # [W, 2] int32 (sequence, query tile), with FLAT_GRID; else unused
    sinks_ptr,  # SINKS: [Hq] sink logits (natural log); else unused
    scale_log2,  # softmax scale * log2(e): scores live in the exp2 domain
    window,  # WINDOWED: a row at p sees keys p - window < k <= p
    softcap_log2,  # SOFTCAP: the logit soft-cap * log2(e)
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
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
    FLAT_GRID: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    SINKS: tl.constexpr,
):
    if FLAT_GRID:
        # One program per (work item, KV head), heads fastest, so the heaviest items (listed
        # first) start first on every head.
        work = tl.program_id(0) // NUM_KV_HEADS
        kv_head = tl.program_id(0) % NUM_KV_HEADS
        seq = tl.load(work_items_ptr + 2 * work).to(tl.int64)
        q_tile = tl.load(work_items_ptr + 2 * work + 1)
    else:
        seq = tl.program_id(0).to(tl.int64)
        q_tile = tl.program_id(1)
        kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    # The padded grid is sized for the longest chunk; shorter chunks leave programs with no
    # rows. The flat grid lists only tiles that exist.
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
    kv_start = 0
    if WINDOWED:  # tiles before the first row's window are not read
        kv_start = window_start(prefix_len + q_tile * BLOCK_Q, window)
    table_ptr = block_tables_ptr + seq * stride_bt

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_PAD], dtype=tl.float32)
    m_i, l_i, acc = attend_kv_range(
        q,
        q_pos,
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
        True,
        WINDOWED,
        SOFTCAP,
        BLOCK_SIZE,
        HEAD_DIM,
        HEAD_PAD,
        TILE_N,
        UPCAST,
    )

    if SINKS:
        sinks = tl.load(sinks_ptr + heads, mask=g < GROUP, other=0.0).to(tl.float32)
        sinks = sinks * 1.4426950408889634  # log2(e): scores live in the exp2 domain
        out = normalised_with_sinks(acc, m_i, l_i, sinks)
    else:
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
    grid: str = "flat",
) -> None:
    if grid not in PREFILL_GRIDS:
        raise ValueError(f"grid must be one of {PREFILL_GRIDS}, got {grid!r}")
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


def choose_block_q(group: int, rows_per_program: int = 64) -> tuple[int, int]:
    """(BLOCK_Q, GROUP_PAD): query tokens per program and padded group, with
    BLOCK_Q * GROUP_PAD = max(rows_per_program, GROUP_PAD) rows (rows: query tokens x group
    heads; `launch_checks.tile_size` picks how many)."""
    group_pad = next_power_of_2(group)
    block_q = max(1, rows_per_program // group_pad)
    if block_q * group_pad < MIN_DOT_DIM:
        group_pad = MIN_DOT_DIM // block_q
    return block_q, group_pad


def prefill_work_items(
    query_lens: torch.Tensor,  # [B] int, host
    seq_lens: torch.Tensor,  # [B] int, host: cached prefix + new tokens
    block_q: int,
) -> torch.Tensor:  # [W, 2] int32, host
    """(sequence, query tile) of every tile that holds query tokens, the tiles that read the
    most keys first so that the longest programs do not start last and set the tail."""
    query_lens, seq_lens = query_lens.long(), seq_lens.long()
    num_tiles = (query_lens + block_q - 1) // block_q  # [B]
    seqs = torch.repeat_interleave(torch.arange(num_tiles.shape[0]), num_tiles)  # [W]
    first_item = torch.cumsum(num_tiles, 0) - num_tiles
    tiles = torch.arange(seqs.shape[0]) - first_item[seqs]
    num_keys = (seq_lens - query_lens)[seqs] + torch.minimum(
        (tiles + 1) * block_q, query_lens[seqs]
    )
    order = torch.argsort(num_keys, descending=True, stable=True)
    return torch.stack([seqs[order], tiles[order]], 1).to(torch.int32)


def build_work_items(
    query_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:  # [W, 2] int32 on device
    """The flat grid's work list for a step, from host-side lengths: build it once per step
    and pass it to every layer's `paged_prefill_attention(work_items=...)` for a query of
    this dtype on this device (which set the tile size)."""
    block_q, _ = choose_block_q(num_heads // num_kv_heads, tile_size(dtype, device))
    items = prefill_work_items(torch.tensor(query_lens), torch.tensor(seq_lens), block_q)
    return items.to(device)


def check_work_items(work_items: torch.Tensor, query: torch.Tensor) -> None:
    if work_items.dim() != 2 or work_items.shape[1] != 2 or work_items.dtype != torch.int32:
        raise ValueError(
            f"work_items must be [W, 2] int32 (sequence, query tile), got "
            f"{tuple(work_items.shape)} {work_items.dtype}"
        )
    if work_items.device != query.device or not work_items.is_contiguous():
        raise ValueError(f"work_items must be contiguous on {query.device}")


def prefill_grid(
    grid: str,
    work_items: torch.Tensor | None,
    num_seqs: int,
    max_query_len: int,
    num_kv_heads: int,
    block_q: int,
) -> tuple[int, ...]:
    """Programs to launch: one per (work item, KV head) for "flat"; (sequences x tiles of the
    longest chunk x KV heads) for "padded", the pre-work-list grid kept for comparison."""
    if grid == "flat":
        return (work_items.shape[0] * num_kv_heads,)
    return (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)


def checked_work_items(
    work_items: torch.Tensor | None,
    query: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_q: int,
) -> torch.Tensor:
    """The flat grid's work items as given (checked), or computed here (a device sync)."""
    if work_items is None:
        query_lens = (query_start_loc[1:] - query_start_loc[:-1]).cpu()
        work_items = prefill_work_items(query_lens, seq_lens.cpu(), block_q).to(query.device)
    check_work_items(work_items, query)
    return work_items


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
    work_items: torch.Tensor | None = None,
    grid: str = "flat",
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head (GPT-OSS)
) -> torch.Tensor:  # [T, Hq, D]
    """Causal attention of a chunk of new tokens over a cached paged prefix plus themselves.
    A decode is the case of one new token, so a mixed batch goes through here whole. The new
    tokens' keys and values must already be in the cache.

    `grid`: "flat" (default) launches one program per query tile that exists, from
    `work_items` (see `build_work_items`; computed here, with a device sync, when not
    given); "padded" launches (sequences x tiles of the longest chunk), sized by
    `max_query_len` (computed with a sync when not given). `out`, if given, receives the
    result. `sliding_window`, `softcap`, `sinks`: as `kernels.reference`'s twin."""
    check_prefill_args(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, grid)
    sinks_checked = checked_sinks(sinks, query)
    num_tokens, num_heads, head_dim = query.shape
    num_seqs, (num_kv_heads, block_size) = seq_lens.shape[0], k_cache.shape[2:0:-1]
    out = output_like(query, out)
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    tile = tile_size(query.dtype, query.device)
    block_q, group_pad = choose_block_q(group, tile)
    if grid == "flat":
        work_items = checked_work_items(work_items, query, query_start_loc, seq_lens, block_q)
    elif max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    launch_grid = prefill_grid(
        grid, work_items, num_seqs, max_query_len or 0, num_kv_heads, block_q
    )
    if math.prod(launch_grid) == 0:
        return out
    paged_prefill_kernel[launch_grid](
        out, query, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
        work_items if grid == "flat" else seq_lens,  # unused without FLAT_GRID
        query if sinks_checked is None else sinks_checked,  # unused without SINKS
        scale * LOG2_E, sliding_window or 0, (softcap or 1.0) * LOG2_E,
        *query.stride()[:2], *out.stride()[:2], *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q,
        HEAD_DIM=head_dim, HEAD_PAD=max(MIN_DOT_DIM, next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, TILE_N=max(tile, block_size), UPCAST=upcast_for_dot(query),
        FLAT_GRID=grid == "flat", WINDOWED=sliding_window is not None,
        SOFTCAP=softcap is not None, SINKS=sinks_checked is not None,
    )  # fmt: skip
    return out
