"""The (token, choice) pairs of a mixture-of-experts step sorted by expert and padded so that
each expert's rows fill whole blocks of `block_m`: the row order of the fused-MoE kernel
(`kernels/fused_moe.py`), where one program multiplies one block of rows by one expert.

Pair p is token p // top_k's choice p % top_k. For ids [[2, 0], [2, 1]], 3 experts and
block_m 4 the pairs by expert are 0: [1], 1: [3], 2: [0, 2], each padded to 4 rows with the
pair count (4, no pair), and each block names its expert; the buffers have room for the
worst padding (4 + 3 * 3 rows, 4 blocks), and the block past the end names expert -1:

    sorted_pairs  = [1, 4, 4, 4,  3, 4, 4, 4,  0, 2, 4, 4,  4, 4, 4, 4]
    block_experts = [0, 1, 2, -1]

Plain torch ops with no read back to the host, so the step never waits on the device: the
buffers are sized for the worst padding, num_pairs + min(E, num_pairs) * (block_m - 1)
rows in whole blocks, and the kernel skips the blocks past the padded end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AlignedPairs:
    sorted_pairs: torch.Tensor  # [num_blocks * block_m] int32; num_pairs marks a padding row
    block_experts: torch.Tensor  # [num_blocks] int32; -1: past the padded end, skipped
    num_padded: torch.Tensor  # [1] int64: rows up to the padded end (on the device)
    num_pairs: int  # T * top_k
    block_m: int


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the padded order in the worst case, rounded up to whole blocks: every expert
    that has a pair (at most min(E, pairs)) wastes up to block_m - 1 rows."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """`ids` [T, top_k] of each token's experts -> the pairs sorted by expert, padded to
    whole blocks of `block_m` per expert (see the module's docstring)."""
    if ids.dim() != 2:
        raise ValueError(f"expert ids must be [tokens, top_k], got shape {tuple(ids.shape)}")
    if block_m < 1:
        raise ValueError(f"block_m must be at least 1, got {block_m}")
    device = ids.device
    flat = ids.reshape(-1).long()
    num_pairs = flat.numel()
    # a scatter-add, not bincount: bincount on CUDA reads the largest id back to the host
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # [E]
    padded_end = ((counts + block_m - 1) // block_m * block_m).cumsum(0)  # [E]
    padded_start = padded_end - (counts + block_m - 1) // block_m * block_m
    order = flat.argsort(stable=True)  # pairs grouped by expert, in pair order within one
    expert_of_row = flat[order]
    rank_in_expert = (
        torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[expert_of_row]
    )
    rows = max_padded_rows(num_pairs, num_experts, block_m)
    sorted_pairs = torch.full((rows,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs[padded_start[expert_of_row] + rank_in_expert] = order.to(torch.int32)
    block_starts = torch.arange(0, rows, block_m, device=device)
    # the first expert whose padded range ends after the block's first row owns the block
    owner = torch.searchsorted(padded_end, block_starts, right=True)
    block_experts = torch.where(owner < num_experts, owner, -1).to(torch.int32)
    return AlignedPairs(sorted_pairs, block_experts, padded_end[-1:], num_pairs, block_m)
