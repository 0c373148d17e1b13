"""Attention of layers with a sliding window, logit soft-capping or attention sinks on the
CPU, one sequence at a time in float32 (the arithmetic of Hugging Face's eager attention,
which is where soft-capping and sinks live): each query reads only the blocks that hold its
window, so blocks the scheduler has given back (wholly before every query's window) are
never read.

Neither the C kernel nor torch's fused SDPA has these masks, the cap or the sinks (a learned
logit per head in the softmax's denominator, GPT-OSS); a layer with none of them keeps the
paths of `torch_backend.py`.
"""

from __future__ import annotations

import torch

from pagedserve.kernels.reference import capped, softmax_with_sinks
from pagedserve.services.gpu_worker.attention.base import AttentionMetadata


def windowed_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D], already holding the step's keys
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head
) -> torch.Tensor:  # [T, Hq, D]
    out = torch.empty_like(query)
    starts, lens = metadata.query_start_list, metadata.seq_lens_list
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        if start < end:
            out[start:end] = _sequence_attention(
                query[start:end], k_cache, v_cache, metadata.block_tables[i], seq_len,
                scale, sliding_window, softcap, sinks,
            )  # fmt: skip
    return out


def _sequence_attention(
    query: torch.Tensor,  # [Q, Hq, D] the sequence's new tokens
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:  # [Q, Hq, D]
    num_new, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    first_query = seq_len - num_new
    # the first key any query sees, rounded down to its block
    lowest = 0 if sliding_window is None else max(0, first_query - sliding_window + 1)
    first_block = lowest // block_size
    block_ids = block_table[first_block : -(-seq_len // block_size)].long()
    offset = first_block * block_size  # position of the first gathered key
    keys = k_cache.index_select(0, block_ids).flatten(0, 1)[: seq_len - offset].float()
    values = v_cache.index_select(0, block_ids).flatten(0, 1)[: seq_len - offset].float()
    group = num_heads // num_kv_heads
    q = query.float().view(num_new, num_kv_heads, group, head_dim)
    scores = capped(torch.einsum("qkgd,lkd->kgql", q, keys) * scale, softcap)  # [Hkv,G,Q,L]
    query_pos = torch.arange(first_query, seq_len, device=query.device)
    key_pos = torch.arange(offset, seq_len, device=query.device)
    visible = key_pos[None, :] <= query_pos[:, None]  # [Q, L]
    if sliding_window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - sliding_window
    head_sinks = None if sinks is None else sinks.view(num_kv_heads, group, 1, 1)
    probs = softmax_with_sinks(scores.masked_fill(~visible, float("-inf")), head_sinks)
    out = torch.einsum("kgql,lkd->qkgd", probs, values)  # [Q, Hkv, G, D]
    return out.reshape(num_new, num_heads, head_dim).to(query.dtype)
