"""The CPU (and fallback) backend: the batched plain-torch functions of kernels/reference.py."""

from __future__ import annotations

import torch

from kernels.reference import paged_decode_attention, paged_prefill_attention, write_kv_cache
from services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend


class TorchAttentionBackend(BaseAttentionBackend):
    name = "torch"

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [N, BS, Hkv, D]
        v_cache: torch.Tensor,  # [N, BS, Hkv, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        write_kv_cache(key, value, k_cache, v_cache, metadata.slot_mapping)
        if metadata.is_decode_only:
            # One batched op for the whole step: the common case of continuous batching.
            return paged_decode_attention(
                query, k_cache, v_cache, metadata.block_tables, metadata.seq_lens, self.scale
            )
        return paged_prefill_attention(
            query,
            k_cache,
            v_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            self.scale,
        )
