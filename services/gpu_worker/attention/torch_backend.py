"""The CPU (and fallback) backend, built on the batched plain-torch functions of
kernels/reference.py, which stay its test oracle.

Two hot paths are done here more cheaply than the reference does them, because on CPU they
dominate a decode step: the KV write is one `index_copy_` per cache (no boolean masking when
no slot is -1), and a decode-only batch runs as two batched matmuls in the cache dtype with a
float32 softmax, instead of einsums over float32 copies of the whole gathered context.
Prefill and mixed batches go through `paged_prefill_attention` unchanged.
"""

from __future__ import annotations

import torch

from kernels.reference import gather_kv, paged_prefill_attention, write_kv_cache
from services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    if bool((slot_mapping < 0).any()):
        write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def batched_decode_attention(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """`paged_decode_attention` with matmuls in the cache dtype (fp32 accumulation inside)."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    keys = gather_kv(k_cache, block_tables, max_seq_len)  # [B, L, Hkv, D]
    values = gather_kv(v_cache, block_tables, max_seq_len)  # [B, L, Hkv, D]
    q = query.to(keys.dtype).view(batch, num_kv_heads, group, head_dim)  # [B, Hkv, G, D]
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1)).float() * scale  # [B, Hkv, G, L]
    positions = torch.arange(max_seq_len, device=query.device)
    padding = positions[None, :] >= seq_lens[:, None].long()  # [B, L]
    scores.masked_fill_(padding[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1).to(values.dtype)
    out = torch.matmul(probs, values.permute(0, 2, 1, 3))  # [B, Hkv, G, D]
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


MAX_DECODE_GROUPS = 4


def grouped_decode_attention(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """Decode attention over length-sorted groups, each padded only to its own longest
    context: with long-tailed lengths, padding everyone to the longest costs several times
    the real work (gathers and matmuls are proportional to the padded length)."""
    lens = seq_lens.tolist()
    batch = len(lens)
    if batch < 2 * MAX_DECODE_GROUPS or max(lens) <= 2 * min(lens):
        return batched_decode_attention(
            query, k_cache, v_cache, block_tables, seq_lens, max(lens), scale
        )
    order = sorted(range(batch), key=lens.__getitem__)
    out = torch.empty_like(query)
    group_size = -(-batch // MAX_DECODE_GROUPS)
    for start in range(0, batch, group_size):
        rows = order[start : start + group_size]
        index = torch.tensor(rows, device=query.device)
        out[index] = batched_decode_attention(
            query[index],
            k_cache,
            v_cache,
            block_tables[index],
            seq_lens[index],
            lens[rows[-1]],
            scale,
        )
    return out


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
        write_kv(key, value, k_cache, v_cache, metadata.slot_mapping)
        if metadata.is_decode_only:
            return grouped_decode_attention(
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
