"""KV cache allocation and how many blocks fit in the memory budget.

A layer's cache is a (K, V) pair of `[num_blocks, block_size, num_kv_heads, head_dim]`. A
latent layer (multi-head latent attention, `KVCacheSpec.is_latent`) keeps one tensor
`[num_blocks, block_size, 1, latent_dim + latent_rope_dim]`, handed out as both K and V: its
keys are the latent and the rotary key, its values the latent (the first `latent_dim`
features of the same rows), so a token costs `latent_dim + latent_rope_dim` elements, not
2 x heads x head_dim. Block sizing counts what each layer's spec says a token takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker import cpu_huge_pages
from pagedserve.shared.kv_cache_spec import KVCacheSpec

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB: room for ~20k tokens of the default model in fp32


def num_blocks_for_bytes(budget: int, bytes_per_block: int) -> int:
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"KV cache budget of {budget} bytes holds no block (one block needs "
            f"{bytes_per_block} bytes): raise kv_cache_memory or gpu_memory_utilization"
        )
    return num_blocks


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """The geometry of one rank's paged KV cache: `num_kv_heads` x `head_dim` per token and
    layer, in a K and a V tensor, or (`latent`) one shared tensor of one `head_dim`-wide
    row (`num_kv_heads` 1)."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    latent: bool = False

    @classmethod
    def from_specs(
        cls,
        specs: list[KVCacheSpec],
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> KVCacheLayout:
        """The layout of a model whose layers keep what `specs` say (the heads and head_dim
        of its attention where the layers are not latent). Latent and per-head layers in one
        model are refused: one layout serves every layer."""
        if not specs:
            raise ValueError("a model with no layers has no KV cache")
        kinds = {spec.is_latent for spec in specs}
        if len(kinds) > 1:
            raise ValueError("a model mixing latent and per-head KV layers is not supported")
        first = specs[0]
        if not first.is_latent:
            return cls(len(specs), block_size, num_kv_heads, head_dim, dtype)
        widths = {spec.token_elements(num_kv_heads, head_dim) for spec in specs}
        if len(widths) > 1:
            raise ValueError(f"latent KV layers of different widths {sorted(widths)}")
        return cls(len(specs), block_size, 1, widths.pop(), dtype, latent=True)

    def token_elements(self) -> int:
        """Elements one token takes in one layer's cache."""
        per_tensor = self.num_kv_heads * self.head_dim
        return per_tensor if self.latent else 2 * per_tensor

    def block_bytes(self) -> int:
        """Bytes one block takes over every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * self.block_size * self.token_elements() * element

    def allocate(
        self, num_blocks: int, device: torch.device
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

        def zeros() -> torch.Tensor:
            if device.type == "cpu":  # read from scattered blocks each step: in huge pages
                return cpu_huge_pages.zeros(shape, self.dtype)
            return torch.zeros(shape, dtype=self.dtype, device=device)

        caches = []
        for _ in range(self.num_layers):
            key = zeros()
            caches.append((key, key if self.latent else zeros()))
        return caches

    def allocated_bytes(self, num_blocks: int) -> int:
        return num_blocks * self.block_bytes()


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
        if value_cache is not key_cache:  # a latent layer's one tensor is both
            value_cache[destinations] = value_cache[sources]
