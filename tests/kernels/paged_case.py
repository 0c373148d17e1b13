"""Builds paged-attention inputs for the kernel tests: a KV cache whose blocks are handed out
in random order, and a poisoned twin of it where every slot outside a sequence's context
(unused tail slots, unowned blocks, block-table padding) holds NaN, so a kernel that reads
one produces NaN. The reference runs on the clean cache: it gathers padding and relies on
masking, which NaN would defeat."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Per-dtype tolerances against the reference. Under the interpreter the kernels compute
# both matmuls in fp32 (see kernels/launch_checks.upcast_for_dot), so the gap is the final
# rounding of the output to the dtype plus accumulation order.
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


@dataclass(frozen=True, slots=True)
class PagedCase:
    query: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [N, BS, Hkv, D], clean: unused slots 0
    v_cache: torch.Tensor  # [N, BS, Hkv, D]
    poisoned_k_cache: torch.Tensor  # same, unused slots NaN
    poisoned_v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with an unowned block
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    scale: float


def make_paged_case(
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> PagedCase:
    """Sequence i has seq_lens[i] cached tokens, of which the last query_lens[i] are new."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    # Two spare blocks never owned by anyone: one pads the tables, one is just poison.
    num_blocks = sum(blocks_per_seq) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    pad_block = order.pop()
    max_blocks = max(blocks_per_seq) + 1
    block_tables = torch.full((len(seq_lens), max_blocks), pad_block, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.zeros(shape, dtype=dtype)
    v_cache = torch.zeros(shape, dtype=dtype)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for i, (seq_len, num_seq_blocks) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        owned = [order.pop() for _ in range(num_seq_blocks)]
        block_tables[i, :num_seq_blocks] = torch.tensor(owned, dtype=torch.int32)
        for pos in range(seq_len):
            used[owned[pos // block_size], pos % block_size] = True
    values = torch.randn((*shape, 2), generator=gen).to(dtype)
    k_cache[used] = values[..., 0][used]
    v_cache[used] = values[..., 1][used]
    poison_k, poison_v = k_cache.clone(), v_cache.clone()
    poison_k[~used] = float("nan")
    poison_v[~used] = float("nan")
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=gen).to(dtype)
    return PagedCase(
        query=query,
        k_cache=k_cache,
        v_cache=v_cache,
        poisoned_k_cache=poison_k,
        poisoned_v_cache=poison_v,
        block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=head_dim**-0.5,
    )


def poisoned_like(tensor: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so any element the kernel leaves unwritten fails."""
    return torch.full_like(tensor, float("nan"))
