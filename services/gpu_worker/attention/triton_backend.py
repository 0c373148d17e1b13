"""The CUDA backend: the Triton kernels of `kernels/` (also runs on CPU tensors under
TRITON_INTERPRET=1, which is how its tests run without a GPU)."""

from __future__ import annotations

import torch

from kernels.kv_cache_write import write_kv_cache
from kernels.paged_decode import paged_decode_attention
from kernels.paged_prefill import paged_prefill_attention
from services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend


class TritonAttentionBackend(BaseAttentionBackend):
    name = "triton"

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
            # The decode kernel can split long contexts across programs (flash-decoding);
            # the host-side maxima in the metadata spare the kernels a device sync.
            return paged_decode_attention(
                query,
                k_cache,
                v_cache,
                metadata.block_tables,
                metadata.seq_lens,
                self.scale,
                max_seq_len=metadata.max_seq_len,
            )
        return paged_prefill_attention(
            query,
            k_cache,
            v_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            self.scale,
            max_query_len=metadata.max_query_len,
        )
