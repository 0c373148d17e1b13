"""Attention of layers with a sliding window, logit soft-capping or attention sinks on the
CPU, one sequence at a time in float32: each query reads only the blocks that hold its
window, so blocks the scheduler has given back (wholly before every query's window) are
never read.

Neither the C kernel nor torch's public SDPA has the cap or the sinks (a learned logit per
head in the softmax's denominator, GPT-OSS), so such layers come here; a layer with none of
them keeps the paths of `torch_backend.py`. Two forms, the same arithmetic:
- fused (without a cap): torch's CPU flash attention with an additive mask, which also
  returns each row's log-sum-exp L; a sink s then scales the row by exp(L) / (exp(L) +
  exp(s)) = sigmoid(L - s). The query heads that share a KV head are that head's rows.
  a prefill chunk in about a quarter of the eager time, a decode in about the same
  (`python -m benchmarks.attention_sinks`, `benchmarks/results/attention_sinks_cpu.json`);
- eager (with a cap, on other devices, or where torch lacks the op): einsums and a
  softmax, the arithmetic of Hugging Face's eager attention, where soft-capping lives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.kernels.reference import capped, softmax_with_sinks
from pagedserve.services.gpu_worker.attention.base import AttentionMetadata

# (out, logsumexp) = op(q, k, v, dropout_p, is_causal, attn_mask=, scale=), [B, H, L, D]
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def windowed_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D], already holding the step's keys
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None = None,  # [Hq] a learned logit per query head
    fused: bool | None = None,  # None: fused wherever it applies (no cap, the op exists)
) -> torch.Tensor:  # [T, Hq, D]
    if fused is None:  # the op is the CPU's; the CUDA fallback stays eager
        fused = softcap is None and _FLASH_WITH_LSE is not None and query.device.type == "cpu"
    elif fused and softcap is not None:
        raise ValueError("the fused form has no logit soft-cap")
    out = torch.empty_like(query)
    starts, lens = metadata.query_start_list, metadata.seq_lens_list
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        if start < end:
            keys, values, visible = _window_of(
                k_cache, v_cache, metadata.block_tables[i], seq_len, end - start, sliding_window
            )
            if fused:
                out[start:end] = _fused_attention(
                    query[start:end], keys, values, visible, scale, sinks
                )
            else:
                out[start:end] = _eager_attention(
                    query[start:end], keys, values, visible, scale, softcap, sinks
                )
    return out


def _window_of(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
    num_new: int,
    sliding_window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float32 keys and values [L, Hkv, D] from the block that holds the first key any
    of the sequence's `num_new` queries sees, and which of them each query sees [Q, L]."""
    block_size = k_cache.shape[1]
    first_query = seq_len - num_new
    lowest = 0 if sliding_window is None else max(0, first_query - sliding_window + 1)
    first_block = lowest // block_size
    block_ids = block_table[first_block : -(-seq_len // block_size)].long()
    offset = first_block * block_size  # position of the first gathered key
    keys = k_cache.index_select(0, block_ids).flatten(0, 1)[: seq_len - offset].float()
    values = v_cache.index_select(0, block_ids).flatten(0, 1)[: seq_len - offset].float()
    query_pos = torch.arange(first_query, seq_len, device=k_cache.device)
    key_pos = torch.arange(offset, seq_len, device=k_cache.device)
    visible = key_pos[None, :] <= query_pos[:, None]  # [Q, L]
    if sliding_window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - sliding_window
    return keys, values, visible


def _eager_attention(
    query: torch.Tensor,  # [Q, Hq, D] the sequence's new tokens
    keys: torch.Tensor,  # [L, Hkv, D] float32
    values: torch.Tensor,
    visible: torch.Tensor,  # [Q, L] bool
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:  # [Q, Hq, D]
    num_new, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    q = query.float().view(num_new, num_kv_heads, group, head_dim)
    scores = capped(torch.einsum("qkgd,lkd->kgql", q, keys) * scale, softcap)  # [Hkv,G,Q,L]
    head_sinks = None if sinks is None else sinks.view(num_kv_heads, group, 1, 1)
    probs = softmax_with_sinks(scores.masked_fill(~visible, float("-inf")), head_sinks)
    out = torch.einsum("kgql,lkd->qkgd", probs, values)  # [Q, Hkv, G, D]
    return out.reshape(num_new, num_heads, head_dim).to(query.dtype)


def _fused_attention(
    query: torch.Tensor,  # [Q, Hq, D] the sequence's new tokens
    keys: torch.Tensor,  # [L, Hkv, D] float32
    values: torch.Tensor,
    visible: torch.Tensor,  # [Q, L] bool
    scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:  # [Q, Hq, D]
    num_new, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    # row q * G + g of KV head k: query q's head k * G + g
    rows = query.float().view(num_new, num_kv_heads, group, head_dim).transpose(0, 1)
    rows = rows.reshape(1, num_kv_heads, num_new * group, head_dim)
    mask = torch.zeros(visible.shape, device=query.device).masked_fill_(~visible, float("-inf"))
    if sinks is None:
        out = F.scaled_dot_product_attention(
            rows, keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask.repeat_interleave(group, 0), scale=scale,
        )[0]  # fmt: skip
    else:
        out, lse = _FLASH_WITH_LSE(
            rows, keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=mask.repeat_interleave(group, 0), scale=scale,
        )  # fmt: skip
        row_sinks = sinks.float().view(num_kv_heads, group).repeat(1, num_new)  # [Hkv, Q*G]
        out = out[0] * torch.sigmoid(lse[0] - row_sinks)[..., None]
    out = out.view(num_kv_heads, num_new, group, head_dim).transpose(0, 1)
    return out.reshape(num_new, num_heads, head_dim).to(query.dtype)
