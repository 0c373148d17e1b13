"""A float64 oracle for paged attention, written independently of the kernels and of
`kernels.reference`: each sequence's context is rebuilt token by token from the block table,
every query head gets its own copy of its KV head's keys, and causal attention is computed
densely in float64 on the CPU. Small shapes only."""

from __future__ import annotations

import torch


def context_rows(
    cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_table_row: list[int],
    seq_len: int,
) -> torch.Tensor:  # [L, Hkv, D] float64, CPU
    block_size = cache.shape[1]
    rows = [cache[block_table_row[p // block_size], p % block_size] for p in range(seq_len)]
    return torch.stack(rows).double().cpu()


def dense_causal_attention_f64(
    query: torch.Tensor,  # [T, Hq, D], new tokens packed by sequence
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:  # [T, Hq, D] float64, CPU
    num_heads = query.shape[1]
    group = num_heads // k_cache.shape[2]
    tables = block_tables.tolist()
    outputs = []
    start = 0
    for table, q_len, seq_len in zip(tables, query_lens, seq_lens, strict=True):
        if q_len == 0:
            continue
        q = query[start : start + q_len].double().cpu()  # [Q, Hq, D]
        start += q_len
        keys = context_rows(k_cache, table, seq_len).repeat_interleave(group, dim=1)
        values = context_rows(v_cache, table, seq_len).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,lhd->hql", q, keys) * scale  # [Hq, Q, L]
        query_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        hidden = torch.arange(seq_len)[None, :] > query_pos  # [Q, L]
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        outputs.append(torch.einsum("hql,lhd->qhd", probs, values))
    return torch.cat(outputs)
