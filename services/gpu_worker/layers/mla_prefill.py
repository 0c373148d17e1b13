"""MLA's expanded form for long prefill chunks: keys and values of every head rebuilt from
the cached latents, then ordinary causal attention at qk_head_dim / v_head_dim.

Per key and head, the absorbed form costs 2 x (kv_lora_rank + qk_rope_head_dim) multiply-adds
a query (scores over the latent row, and the same row as value); the expanded one costs
qk_head_dim + v_head_dim a query, plus kv_lora_rank x (qk_nope_head_dim + v_head_dim) once
to expand the key. A chunk of Q new tokens is cheaper expanded from

    Q* = kv_lora_rank (qk_nope + v) / (2 (kv_lora_rank + rope) - qk_head_dim - v)

queries on (DeepSeek-V2/V3 and V2-Lite: 512 x 256 / (1152 - 320) = 158). Measured, the
absorbed form keeps its lead further (`python -m benchmarks.mla_prefill`, one V2-Lite-shaped
layer, fp32, 2 threads, AMD EPYC, AVX2, box loaded; absorbed / expanded time, median of 9
alternated rounds, `benchmarks/results/mla_prefill.json`): 0.71x at a 128-token chunk, 0.94x
at 256, 1.24x at 512, 1.18x for 512 over a 1024-token prefix. So chunks expand from
`EXPAND_FACTOR` x Q* tokens (316 for those models). Decodes and short chunks stay
absorbed; a step's sequences are split once (`plan_step`) and every layer reuses the split
from the metadata's scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.kernels.reference import gather_kv
from pagedserve.services.gpu_worker.attention.base import (
    AttentionMetadata,
    build_attention_metadata,
)

PLAN_KEY = "mla_prefill_plan"


EXPAND_FACTOR = 2  # chunks expand from twice the multiply-add break-even (measured above)


def expand_from(kv_lora_rank: int, rope: int, nope: int, v: int) -> int:
    """The chunk length from which prefill expands: `EXPAND_FACTOR` x `Q*`, the length from
    which the expanded form takes fewer multiply-adds."""
    saved = 2 * (kv_lora_rank + rope) - (nope + rope) - v
    if saved <= 0:
        return 1 << 62  # never
    return EXPAND_FACTOR * math.ceil(kv_lora_rank * (nope + v) / saved)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step's sequences split by form; `absorbed` is None where none stays absorbed."""

    expanded: list[int]  # sequences attended expanded
    expanded_rows: torch.Tensor  # [n] int64: their tokens' rows in the step
    absorbed_rows: torch.Tensor  # [m] int64: every other token's row
    absorbed: AttentionMetadata | None  # the metadata of the other sequences alone


def plan_step(metadata: AttentionMetadata, block_size: int, threshold: int) -> StepPlan | None:
    """The step's split (None: every sequence absorbed), made by the first layer."""
    if PLAN_KEY in metadata.backend_scratch:
        return metadata.backend_scratch[PLAN_KEY]
    starts, lens = metadata.query_start_list, metadata.seq_lens_list
    expanded = [i for i in metadata.multi_token_seqs if starts[i + 1] - starts[i] >= threshold]
    plan = None
    if expanded:
        device = metadata.slot_mapping.device
        others = [i for i in range(metadata.num_seqs) if i not in expanded]

        def rows(seqs: list[int]) -> torch.Tensor:
            index = [r for i in seqs for r in range(starts[i], starts[i + 1])]
            return torch.tensor(index, dtype=torch.int64, device=device)

        absorbed = None
        if others:
            tables = [
                metadata.block_tables[i, : -(-lens[i] // block_size)].tolist() for i in others
            ]
            absorbed = build_attention_metadata(
                [lens[i] for i in others], [starts[i + 1] - starts[i] for i in others], tables,
                block_size, device,
            )  # fmt: skip
        plan = StepPlan(expanded, rows(expanded), rows(others), absorbed)
    metadata.backend_scratch[PLAN_KEY] = plan
    return plan


def write_rows(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Latent rows [n, 1, W] into their slots of the cache [N, BS, 1, W] (slot -1: skipped)."""
    keep = slots >= 0
    if not bool(keep.all()):
        rows, slots = rows[keep], slots[keep]
    cache.view(-1, 1, cache.shape[-1]).index_copy_(0, slots, rows.to(cache.dtype))


def expanded_chunk(
    query: torch.Tensor,  # [Q, h, qk_head_dim] one sequence's new tokens, rope part rotated
    cache: torch.Tensor,  # [N, BS, 1, latent + rope], already holding the chunk's rows
    block_table: torch.Tensor,  # [1, max_blocks]
    seq_len: int,  # cached prefix + new tokens
    expand: torch.nn.Module,  # kv_b_proj: [L, latent] -> [L, h (nope + v)]
    nope: int,
    v: int,
    scale: float,
) -> torch.Tensor:  # [Q, h, v]
    """Causal attention of one chunk over its whole context, keys and values expanded."""
    num_new, num_heads = query.shape[0], query.shape[1]
    context = gather_kv(cache, block_table, seq_len)[0, :, 0]  # [L, latent + rope]
    rope = query.shape[2] - nope
    latent, k_rope = context.to(query.dtype).split([context.shape[1] - rope, rope], dim=-1)
    k_nope, values = expand(latent).view(seq_len, num_heads, nope + v).split([nope, v], dim=-1)
    keys = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, num_heads, -1)], dim=-1)
    mask = None
    if seq_len != num_new:  # query j sits at position seq_len - num_new + j
        mask = torch.ones(num_new, seq_len, dtype=torch.bool, device=query.device)
        mask = mask.tril(seq_len - num_new)
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
        attn_mask=mask, is_causal=mask is None, scale=scale,
    )  # fmt: skip
    return out.transpose(0, 1)
