"""The attention backend contract: what the model runner hands a backend and what it gets back.

The runner builds one `AttentionMetadata` per step (`build_attention_metadata`) and every
layer's attention reuses it. Layouts are those of `kernels/reference.py`:

    query      [num_tokens, num_heads, head_dim]       the step's new tokens, packed by sequence
    key, value [num_tokens, num_kv_heads, head_dim]    (this rank's heads only under TP)
    k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]   one pair per layer
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what each sequence attends to.

    Sequence i's new tokens are query[query_start_loc[i]:query_start_loc[i + 1]]; they sit at
    the last positions of its context, which after this step's writes is seq_lens[i] tokens
    long and lives in the blocks block_tables[i] lists (padded with block 0).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64; slot = block_id * block_size + offset
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, cached prefix + new tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    is_decode_only: bool  # every sequence has exactly one new token
    max_seq_len: int
    max_query_len: int
    # The same facts as Python lists, and the batch split into single-token sequences and
    # multi-token chunks, computed once per step so that no layer pays for them again.
    seq_lens_list: list[int]
    query_start_list: list[int]
    single_token_seqs: torch.Tensor  # [S1] int64: sequences with one new token
    single_token_rows: torch.Tensor  # [S1] int64: that token's row in query
    multi_token_seqs: list[int]  # sequences with several new tokens
    # What a backend derives from this step's facts once and every layer reuses (e.g. the
    # Triton prefill kernel's work list), keyed by the backend.
    backend_scratch: dict[str, Any] = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])


def build_attention_metadata(
    seq_lens: list[int],
    query_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> AttentionMetadata:
    """Metadata for sequences with `query_lens[i]` new tokens ending at `seq_lens[i]`.

    Built from Python lists with one tensor per field: per-sequence torch calls and index
    arithmetic on small tensors cost ~2% of a CPU decode step."""
    num_seqs = len(seq_lens)
    max_blocks = max((len(t) for t in block_tables), default=1) or 1
    table = [blocks + [0] * (max_blocks - len(blocks)) for blocks in block_tables]
    starts = [0]
    slots: list[int] = []
    for seq_len, num_new, blocks in zip(seq_lens, query_lens, block_tables, strict=True):
        starts.append(starts[-1] + num_new)
        # the new tokens sit at the last positions of the context
        for position in range(seq_len - num_new, seq_len):
            slots.append(blocks[position // block_size] * block_size + position % block_size)
    single = [i for i, n in enumerate(query_lens) if n == 1]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(table, dtype=torch.int32, device=device).view(
            num_seqs, max_blocks
        ),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        is_decode_only=all(q == 1 for q in query_lens),
        max_seq_len=max(seq_lens, default=0),
        max_query_len=max(query_lens, default=0),
        seq_lens_list=list(seq_lens),
        query_start_list=starts,
        single_token_seqs=torch.tensor(single, dtype=torch.int64, device=device),
        single_token_rows=torch.tensor(
            [starts[i] for i in single], dtype=torch.int64, device=device
        ),
        multi_token_seqs=[i for i, n in enumerate(query_lens) if n > 1],
    )


class BaseAttentionBackend(ABC):
    """Paged attention for one layer.

    Contract of `forward`: first store `key`/`value` of every new token in
    `k_cache`/`v_cache` at `metadata.slot_mapping` (slot -1: skip), then return, for every new
    token, causal attention over its sequence's whole context (the cached prefix plus the new
    tokens up to and including itself), as `[num_tokens, num_heads, head_dim]` in the query's
    dtype. Heads are grouped: query head h reads kv head h // (num_heads // num_kv_heads).
    Batches may mix prefill chunks over a cached prefix with single-token decodes;
    `metadata.is_decode_only` lets a backend take a faster path when every sequence has one
    new token. A backend holds no per-step state.

    A layer with `sliding_window` W attends, from position p, only to keys p - W < k <= p
    (W keys, itself included, as Hugging Face's mask); blocks wholly before every query's
    window may have been given back by the scheduler and must not be read. With
    `logit_softcap` c, scores become `c * tanh(score / c)` before the mask (Gemma 2). With
    `sinks` [num_heads] (GPT-OSS), each head's learned logit joins the softmax's denominator
    as a key with no value (`kernels.reference.softmax_with_sinks`); the layer owns the
    parameter, the backend reads it at every call (so it sees the loaded values).
    """

    name: str = "base"

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        sinks: torch.Tensor | None = None,  # [num_heads] of this rank
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must be [num_heads={num_heads}], got {tuple(sinks.shape)}")
        self.sinks = sinks

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [N, BS, Hkv, D]
        v_cache: torch.Tensor,  # [N, BS, Hkv, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Write the new K/V into the cache, then attend; see the class docstring."""
