"""Plain-torch twins of the Triton kernels. They are the test oracle for the kernels and the
attention of the CPU serving path (the `torch` backend), so they are batched, not per-token.

Layouts, shared with the kernels:
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]   one pair per layer
    slot_mapping       [num_tokens] int64; slot = block_id * block_size + offset; -1: skip
    block_tables       [num_seqs, max_blocks_per_seq] int32, padded with any valid block id
    seq_lens           [num_seqs] int32: tokens in the cache for each sequence after this
                       step's writes (cached prefix + the new tokens)
    query_start_loc    [num_seqs + 1] int32: sequence i's new tokens are
                       query[query_start_loc[i]:query_start_loc[i + 1]] and sit at the last
                       positions of its context
"""

from __future__ import annotations

import torch


def write_kv_cache(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Store each token's key and value at its slot; tokens with slot -1 are skipped."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = key[keep].to(
        k_cache.dtype
    )
    v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = value[keep].to(
        v_cache.dtype
    )


def gather_kv(
    cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks]
    max_len: int,
) -> torch.Tensor:  # [B, max_len, Hkv, D]
    """The first `max_len` cached tokens of every sequence, in position order."""
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    num_blocks_needed = (max_len + block_size - 1) // block_size
    batch = block_tables.shape[0]
    block_ids = block_tables[:, :num_blocks_needed].reshape(-1).long()
    # index_select over whole blocks copies contiguous rows: several times faster on CPU
    # than advanced indexing of the 4-d cache.
    blocks = cache.reshape(num_blocks, -1).index_select(0, block_ids)  # [B * nb, BS * Hkv * D]
    return blocks.view(batch, -1, num_kv_heads, head_dim)[:, :max_len]


def capped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Logit soft-capping: `softcap * tanh(scores / softcap)`; the scores as they are
    without a cap."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def softmax_with_sinks(
    scores: torch.Tensor,  # [..., L] float32, masked keys at -inf
    sinks: torch.Tensor | None,  # broadcastable to [..., 1]: a logit per query head, or None
) -> torch.Tensor:  # [..., L] the probabilities over the keys
    """Softmax over the keys; with attention sinks (GPT-OSS), each head's learned logit joins
    the denominator as a key with no value: p_l = exp(s_l) / (sum_j exp(s_j) + exp(sink))."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.float().expand(scores[..., :1].shape)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def paged_decode_attention(
    query: torch.Tensor,  # [B, Hq, D], one new token per sequence
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, >= 1, including the new token
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head (GPT-OSS)
) -> torch.Tensor:  # [B, Hq, D]
    """Attention of each sequence's newest token over its whole cached context (its last
    `sliding_window` tokens, itself included, when given); scores `softcap * tanh(s /
    softcap)` when `softcap` is given; each head's sink logit in the softmax's denominator
    when `sinks` are given (`softmax_with_sinks`)."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max())
    keys = gather_kv(k_cache, block_tables, max_len).float()  # [B, L, Hkv, D]
    values = gather_kv(v_cache, block_tables, max_len).float()  # [B, L, Hkv, D]
    q = query.float().view(batch, num_kv_heads, group, head_dim)  # [B, Hkv, G, D]
    scores = capped(torch.einsum("bkgd,blkd->bkgl", q, keys) * scale, softcap)  # [B, Hkv, G, L]
    positions = torch.arange(max_len, device=query.device)
    valid = positions[None, :] < seq_lens[:, None].long()  # [B, L]
    if sliding_window is not None:
        valid &= positions[None, :] > seq_lens[:, None].long() - 1 - sliding_window
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    head_sinks = None if sinks is None else sinks.view(num_kv_heads, group, 1)
    probs = softmax_with_sinks(scores, head_sinks)
    out = torch.einsum("bkgl,blkd->bkgd", probs, values)  # [B, Hkv, G, D]
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


def paged_prefill_attention(
    query: torch.Tensor,  # [T, Hq, D], the new tokens of every sequence, packed
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32, cached prefix + new tokens
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head (GPT-OSS)
) -> torch.Tensor:  # [T, Hq, D]
    """Causal attention of a chunk of new tokens over a cached paged prefix plus themselves.
    A decode is the case of one new token, so a mixed batch goes through here whole. With
    `sliding_window`, the query at position p sees keys p - sliding_window < k <= p; with
    `softcap`, scores are `softcap * tanh(s / softcap)` (Gemma 2); with `sinks`, each head's
    logit joins the softmax's denominator (`softmax_with_sinks`)."""
    _, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    head_sinks = None if sinks is None else sinks.view(num_kv_heads, group, 1, 1)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        if start == end:
            continue
        num_new = end - start
        table = block_tables[i : i + 1]
        keys = gather_kv(k_cache, table, seq_len)[0].float()  # [L, Hkv, D]
        values = gather_kv(v_cache, table, seq_len)[0].float()  # [L, Hkv, D]
        q = query[start:end].float().view(num_new, num_kv_heads, group, head_dim)
        scores = capped(torch.einsum("qkgd,lkd->kgql", q, keys) * scale, softcap)  # [Hkv,G,Q,L]
        query_pos = torch.arange(seq_len - num_new, seq_len, device=query.device)
        key_pos = torch.arange(seq_len, device=query.device)
        causal = key_pos[None, :] <= query_pos[:, None]  # [Q, L]
        if sliding_window is not None:
            causal &= key_pos[None, :] > query_pos[:, None] - sliding_window
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = softmax_with_sinks(scores, head_sinks)
        seq_out = torch.einsum("kgql,lkd->qkgd", probs, values)  # [Q, Hkv, G, D]
        out[start:end] = seq_out.reshape(num_new, num_heads, head_dim).to(query.dtype)
    return out


def experts_reference(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H] gate rows then up rows
    w2: torch.Tensor,  # [E, H, I]
    weights: torch.Tensor,  # [T, k]
    ids: torch.Tensor,  # [T, k]
) -> torch.Tensor:  # [T, H]
    """A mixture of SwiGLU experts token by token, given each token's experts and their
    weights: out[t] = sum_j weights[t, j] * down(silu(gate(x[t])) * up(x[t])) of ids[t, j]."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, expert in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            gate, up = (w13[expert] @ x[t]).chunk(2)
            out[t] += weight * (w2[expert] @ (torch.nn.functional.silu(gate) * up))
    return out


def moe_reference(
    x: torch.Tensor,  # [T, H]
    router_weight: torch.Tensor,  # [E, H]
    w13: torch.Tensor,  # [E, 2I, H] gate rows then up rows
    w2: torch.Tensor,  # [E, H, I]
    top_k: int,
    renormalize: bool,
) -> torch.Tensor:  # [T, H]
    """A mixture of SwiGLU experts token by token: the oracle of the grouped expert path.
    Each token's softmax over the router logits, its `top_k` experts (their probabilities
    scaled to sum 1 where `renormalize`), and the weighted sum of those experts' outputs."""
    probs = torch.softmax((x @ router_weight.T).float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return experts_reference(x, w13, w2, weights, ids)
