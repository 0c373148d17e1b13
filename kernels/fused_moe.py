"""Triton fused mixture-of-experts: the experts of a step as two grouped GEMMs over the
(token, choice) pairs sorted by expert (`kernels/moe_align.py`). Twin:
`kernels.reference.experts_reference`.

    hidden[p] = silu(x[t] Wg_e^T) * (x[t] Wu_e^T)      p = (t, j), e = ids[t, j]
    out[t]    = sum_j weights[t, j] * hidden[(t, j)] W2_e^T

One program computes one block of `block_m` rows (all of one expert: the padding makes each
expert's rows whole blocks) by one block of output features, reading the expert's weight
tiles once for the block. The first GEMM gathers its rows from x by token (p // top_k) and
computes the gate and up tiles side by side, so SiLU-and-multiply happens in registers and
only [pairs, I] is written; the second scales each row by its routing weight as it stores
it, by pair, and the k choices of a token are summed after. Padding rows (pair = num_pairs)
are neither read nor written, and blocks past the padded end return at once.

What the wrapper allocates is `workspace_bytes` (the memory profile counts it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagedserve.kernels.launch_checks import check_device, check_dtype, upcast_for_dot
from pagedserve.kernels.moe_align import AlignedPairs, align_pairs, max_padded_rows


@triton.jit
def expert_gemm_kernel(
    a_ptr,  # [rows of a, K]: x by token (GATED) or hidden by pair
    w_ptr,  # [E, N or 2N, K]: w13 (gate rows then up rows) or w2
    out_ptr,  # [num_pairs, N]
    weights_ptr,  # [num_pairs] routing weights, read when SCALE_BY_WEIGHT
    sorted_pairs_ptr,  # [num_blocks * BLOCK_M] int32
    block_experts_ptr,  # [num_blocks] int32, -1: skip
    num_pairs,
    N,
    K,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    ROWS_PER_A: tl.constexpr,  # pairs per row of a: top_k for x, 1 for hidden
    GATED: tl.constexpr,
    SCALE_BY_WEIGHT: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    a_rows = (pairs // ROWS_PER_A).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_am + (k0 + ks)[None, :] * stride_ak,
            mask=valid[:, None] & k_ok[None, :],
            other=0.0,
        )
        w_mask = k_ok[:, None] & cols_ok[None, :]
        w_tile = w_expert + (k0 + ks)[:, None] * stride_wk + cols[None, :].to(tl.int64) * stride_wn
        w = tl.load(w_tile, mask=w_mask, other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tile_product(a, w, acc, UPCAST)
        if GATED:
            w_up = tl.load(w_tile + N * stride_wn, mask=w_mask, other=0.0)
            acc_up = tile_product(a, w_up, acc_up, UPCAST)
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if SCALE_BY_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & cols_ok[None, :])


@triton.jit
def tile_product(a, w, acc, UPCAST: tl.constexpr):
    """acc + a [M, K] x w [K, N] in fp32 (see `launch_checks.upcast_for_dot`)."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, w, acc)
    return acc


@dataclass(frozen=True, slots=True)
class Tiles:
    """A launch's tile sizes: rows per block (the alignment's block_m), output features and
    reduction depth per step, and Triton's warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def choose_tiles(num_pairs: int, num_experts: int, dtype: torch.dtype) -> Tiles:
    """By the rows an expert averages: 16-row blocks (tl.dot's least) for a few (decode), 32
    for up to 32, and past that 128 x 128 tiles on 8 warps, so that each weight tile read
    serves many rows. On an H200 in bf16 (`benchmarks/moe_kernel.py --sweep`, 13 configs)
    128 x 128 x 64 on 8 warps was the fastest at 4096 tokens on all three expert shapes and
    on Mixtral's from 256 tokens (Mixtral 4096 tokens: 6.6 ms against 8.8 ms with 64 x 64);
    below, the sub-millisecond timings differed by less than their noise. fp32 operands
    take twice the registers: 32-wide tiles, 64-row blocks at most."""
    rows_per_expert = num_pairs / num_experts
    if dtype == torch.float32:
        block_m = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 64 else 64
        return Tiles(block_m, 32, 32)
    if rows_per_expert <= 16:
        return Tiles(16, 64, 64)
    if rows_per_expert <= 32:
        return Tiles(32, 64, 64)
    return Tiles(128, 128, 64, num_warps=8)


def warm_up_token_counts(num_experts: int, top_k: int, dtype: torch.dtype) -> list[int]:
    """A step size (tokens) for each tile class `choose_tiles` has for these experts, the
    steps a warm-up runs so that every variant a step can launch is compiled before serving."""
    counts, seen = [], set()
    for rows_per_expert in (1, 17, 33, 65):
        num_tokens = -(-rows_per_expert * num_experts // top_k)
        tiles = choose_tiles(num_tokens * top_k, num_experts, dtype)
        if tiles not in seen:
            seen.add(tiles)
            counts.append(num_tokens)
    return counts


def workspace_bytes(
    num_tokens: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    num_experts: int,
    dtype: torch.dtype,
) -> int:
    """Bytes `fused_experts` holds at its peak for a step of `num_tokens`: the padded pair order and block experts (int32), hidden [pairs, I], the weighted pair rows
    [pairs, H] and the output [T, H]."""
    num_pairs = num_tokens * top_k
    block_m = choose_tiles(num_pairs, num_experts, dtype).block_m
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    item = torch.empty((), dtype=dtype).element_size()
    index_bytes = 4 * (rows + rows // block_m) + 8
    return index_bytes + item * (num_pairs * (intermediate + hidden) + num_tokens * hidden)


def check_experts(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> None:
    check_device(x, w13, w2, weights, ids)
    for name, tensor in (("x", x), ("w13", w13), ("w2", w2)):
        check_dtype(name, tensor)
        if tensor.dtype != x.dtype:
            raise ValueError(f"{name} dtype {tensor.dtype} must match x dtype {x.dtype}")
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"x must be [T, H], w13 [E, 2I, H], w2 [E, H, I]; got {tuple(x.shape)}, "
            f"{tuple(w13.shape)}, {tuple(w2.shape)}"
        )
    num_experts, two_i, hidden = w13.shape
    expected_w2 = (num_experts, hidden, two_i // 2)
    if x.shape[1] != hidden or two_i % 2 or tuple(w2.shape) != expected_w2:
        raise ValueError(
            f"x {tuple(x.shape)}, w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} disagree "
            f"(w2 must be {expected_w2}, x [T, {hidden}])"
        )
    if ids.dim() != 2 or ids.shape[0] != x.shape[0] or weights.shape != ids.shape:
        raise ValueError(
            f"ids and weights must both be [T={x.shape[0]}, top_k], got {tuple(ids.shape)} "
            f"and {tuple(weights.shape)}"
        )


def fused_experts(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H] gate rows then up rows
    w2: torch.Tensor,  # [E, H, I]
    weights: torch.Tensor,  # [T, k] routing weights
    ids: torch.Tensor,  # [T, k] expert ids in 0..E-1 (not checked on device: that would sync)
    tiles: Tiles | None = None,  # None: `choose_tiles` (benchmarks/moe_kernel.py sweeps others)
) -> torch.Tensor:  # [T, H]
    """sum_j weights[t, j] * down(silu(gate(x[t])) * up(x[t])) of expert ids[t, j]."""
    check_experts(x, w13, w2, weights, ids)
    num_tokens, top_k = ids.shape
    num_experts, two_i, hidden = w13.shape
    intermediate = two_i // 2
    if num_tokens == 0:
        return torch.zeros_like(x)
    tiles = tiles or choose_tiles(num_tokens * top_k, num_experts, x.dtype)
    aligned = align_pairs(ids, num_experts, tiles.block_m)
    hidden_rows = x.new_empty(aligned.num_pairs, intermediate)
    launch(x, w13, hidden_rows, weights, aligned, tiles, rows_per_a=top_k, gated=True)
    pair_rows = x.new_empty(aligned.num_pairs, hidden)
    launch(hidden_rows, w2, pair_rows, weights, aligned, tiles, rows_per_a=1, gated=False)
    return pair_rows.view(num_tokens, top_k, hidden).sum(dim=1)


def launch(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    weights: torch.Tensor,
    aligned: AlignedPairs,
    tiles: Tiles,
    rows_per_a: int,
    gated: bool,
) -> None:
    """One grouped GEMM over the aligned pairs: out [pairs, N] from a's rows and w [E, ., K]."""
    n, k = out.shape[1], a.shape[1]
    num_blocks = aligned.block_experts.shape[0]
    grid = (num_blocks, triton.cdiv(n, tiles.block_n))
    expert_gemm_kernel[grid](
        a,
        w,
        out,
        weights.reshape(-1),
        aligned.sorted_pairs,
        aligned.block_experts,
        aligned.num_pairs,
        n,
        k,
        a.stride(0),
        a.stride(1),
        *w.stride(),
        out.stride(0),
        out.stride(1),
        ROWS_PER_A=rows_per_a,
        GATED=gated,
        SCALE_BY_WEIGHT=not gated,
        UPCAST=upcast_for_dot(w),
        BLOCK_M=aligned.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
