"""The CUDA backend: the Triton kernels of `kernels/` (also runs on CPU tensors under
TRITON_INTERPRET=1, which is how its tests run without a GPU)."""

from __future__ import annotations

import itertools

import torch

from pagedserve.kernels.kv_cache_write import write_kv_cache
from pagedserve.kernels.paged_decode import paged_decode_attention
from pagedserve.kernels.paged_prefill import build_work_items, paged_prefill_attention
from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend

WORK_ITEMS_KEY = "triton_prefill_work_items"


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
                sliding_window=self.sliding_window,
                softcap=self.logit_softcap,
                sinks=self.sinks,
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
            work_items=self.prefill_work_items(metadata, query.dtype),
            sliding_window=self.sliding_window,
            softcap=self.logit_softcap,
            sinks=self.sinks,
        )

    def prefill_work_items(self, metadata: AttentionMetadata, dtype: torch.dtype) -> torch.Tensor:
        """The flat grid's (sequence, query tile) list, built on the first layer of a step
        from host-side lengths (no device sync) and reused by the others."""
        items = metadata.backend_scratch.get(WORK_ITEMS_KEY)
        if items is None:
            starts = metadata.query_start_list
            query_lens = [end - start for start, end in itertools.pairwise(starts)]
            items = build_work_items(
                query_lens,
                metadata.seq_lens_list,
                self.num_heads,
                self.num_kv_heads,
                dtype,
                metadata.seq_lens.device,
            )
            metadata.backend_scratch[WORK_ITEMS_KEY] = items
        return items
