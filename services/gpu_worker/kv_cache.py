"""KV cache allocation: one (K, V) pair per layer, `[num_blocks, block_size, num_kv_heads,
head_dim]`, and how many blocks fit in the memory budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB: room for ~20k tokens of the default model in fp32


def block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one block takes over every layer, K and V."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element


def num_blocks_for_bytes(budget: int, bytes_per_block: int) -> int:
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"KV cache budget of {budget} bytes holds no block (one block needs "
            f"{bytes_per_block} bytes): raise kv_cache_memory or gpu_memory_utilization"
        )
    return num_blocks


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(num_layers)
    ]


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """The geometry of one rank's paged KV cache."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def block_bytes(self) -> int:
        return block_bytes(
            self.num_layers, self.block_size, self.num_kv_heads, self.head_dim, self.dtype
        )

    def allocate(
        self, num_blocks: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return allocate_kv_caches(
            self.num_layers, num_blocks, self.block_size, self.num_kv_heads, self.head_dim,
            self.dtype, device,
        )  # fmt: skip


def copy_blocks(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_copies: list[tuple[int, int]]
) -> None:
    """Copy whole blocks, K and V of every layer, source to destination (copy-on-write of
    blocks that forked beams shared). Every source is read before any destination is
    written: a block copied twice in one step gives both copies its content before the step."""
    if not block_copies:
        return
    device = kv_caches[0][0].device
    sources = torch.tensor([s for s, _ in block_copies], dtype=torch.long, device=device)
    destinations = torch.tensor([d for _, d in block_copies], dtype=torch.long, device=device)
    for key_cache, value_cache in kv_caches:  # each [num_blocks, block_size, H, D]
        key_cache[destinations] = key_cache[sources]
        value_cache[destinations] = value_cache[sources]
