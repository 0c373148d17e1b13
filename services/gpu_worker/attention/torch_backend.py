"""The CPU (and fallback) backend, built on the batched plain-torch functions of
kernels/reference.py, which stay its test oracle.

On a CPU with a C compiler, every sequence with at most `cpu_paged_attention.max_query_len`
new tokens (any chunk on the kernel's lanes: float32, and bf16 where it uses `vdpbf16ps`;
else decodes and short chunks, 16)
is attended by one call of the C kernel `kernels/cpu_paged_attention.c`, which reads the
paged cache in place; longer chunks keep the SDPA path below. Without the kernel (no
compiler, `PAGEDSERVE_CPU_ATTENTION_KERNEL=0`, another device or dtype) everything takes the
torch paths.

Two hot paths are done here more cheaply than the reference does them, because on CPU they
dominate a decode step: the KV write is one `index_copy_` per cache (no boolean masking when
no slot is -1), and decode attention is one fused `scaled_dot_product_attention` call per
length-sorted group over the gathered context, read in place (`group_attention`), instead of
einsums over float32 copies of it. A mixed step splits into its single-token sequences (one
batched decode) and its chunks, each through the same fused call over its cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_kv_write, cpu_paged_attention
from pagedserve.kernels.reference import gather_kv, write_kv_cache
from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.attention.decode_plan import (
    DecodeGroup,
    gather_group,
    plan_decode_groups,
    plan_group,
)
from pagedserve.services.gpu_worker.attention.windowed import windowed_attention


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
    all_slots_valid: bool | None = None,  # known already: no slot is -1
    with_kernel: bool | None = None,  # known already: `cpu_kv_write` takes these tensors
) -> None:
    """Every new token's key and value into its slot (slot -1: skipped): one C call where
    `cpu_kv_write` takes the tensors, else torch's ops. The backend knows both flags for a
    whole step, so its layers skip the checks."""
    if with_kernel is None:
        with_kernel = cpu_kv_write.supports(key, value, k_cache, v_cache, slot_mapping)
    if with_kernel:
        cpu_kv_write.write_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    if all_slots_valid is None:
        all_slots_valid = not bool((slot_mapping < 0).any())
    if not all_slots_valid:
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
    """`paged_decode_attention` of the whole batch as one group (see `group_attention`)."""
    group = plan_group(None, block_tables, seq_lens, max_seq_len, k_cache.shape[1])
    return group_attention(query, k_cache, v_cache, group, scale)


def group_attention(
    query: torch.Tensor,  # [G, Hq, D] the group's rows
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    group: DecodeGroup,
    scale: float,
) -> torch.Tensor:  # [G, Hq, D]
    """Decode attention of one group through torch's fused `scaled_dot_product_attention`.

    Keys and values stay as gathered, [G, L, Hkv, D], and are handed over as [G, Hkv, L, D]
    views (no copy). One call per layer replaced a batched matmul per KV head for scores and
    another for values, whose per-row dispatch dominated at decode sizes: 2.5-10x less time
    for the function at 1-48 rows (AVX2 fp32, one thread), the same values within float
    rounding (HF's Llama attention is this same call).

    The Hq / Hkv query heads that share a KV head go in as that head's rows of queries, not
    as heads of their own (`enable_gqa`): the kernel then works through a third of the
    (row, head) tasks and reads each head's keys once for all of them. SDPA alone at 48 rows
    of 176 keys, SmolLM2's 9 / 3 heads, AVX2 fp32: 1517 -> 846 us on 2 threads, 2240 -> 1573
    us on 1; a decode step at 48 sequences of ~170 tokens 630 -> 494-526 ms of CPU (2
    threads, in-process A/B)."""
    keys = gather_group(k_cache, group).transpose(1, 2)  # [G, Hkv, L, D]
    values = gather_group(v_cache, group).transpose(1, 2)
    rows, num_q_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    # The query heads that share a KV head are that head's rows of queries.
    shared_queries = query.view(rows, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        shared_queries,
        keys.to(query.dtype),
        values.to(query.dtype),
        attn_mask=group.visible,  # [G, 1, 1, L] or None
        scale=scale,
    )  # [G, Hkv, Hq / Hkv, D]
    return out.reshape(rows, num_q_heads, head_dim)


def grouped_decode_attention(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    groups: list[DecodeGroup],
    scale: float,
) -> torch.Tensor:  # [B, Hq, D]
    """Decode attention over the planned length-sorted groups (`decode_plan`)."""
    if len(groups) == 1 and groups[0].rows is None:
        return group_attention(query, k_cache, v_cache, groups[0], scale)
    out = torch.empty_like(query)
    for group in groups:
        out[group.rows] = group_attention(query[group.rows], k_cache, v_cache, group, scale)
    return out


def chunk_attention(
    query: torch.Tensor,  # [Q, Hq, D] one sequence's new tokens
    key: torch.Tensor,  # [Q, Hkv, D] their keys
    value: torch.Tensor,  # [Q, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D], already holding the new keys
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_table: torch.Tensor,  # [1, max_blocks] int32
    seq_len: int,  # cached prefix + new tokens
    scale: float,
) -> torch.Tensor:  # [Q, Hq, D]
    """Causal attention of one chunk over its cached prefix and itself, through torch's fused
    scaled_dot_product_attention (about 2.4x the reference's einsums on CPU). A chunk with no
    cached prefix attends to its own keys and needs no gather at all."""
    num_new = query.shape[0]
    if seq_len == num_new:
        keys, values, mask = key, value, None
    else:
        keys = gather_kv(k_cache, block_table, seq_len)[0]  # [L, Hkv, D]
        values = gather_kv(v_cache, block_table, seq_len)[0]
        # Query j sits at position seq_len - num_new + j and sees keys up to there.
        mask = torch.ones(num_new, seq_len, dtype=torch.bool, device=query.device).tril(
            seq_len - num_new
        )
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1).unsqueeze(0),  # [1, Hq, Q, D]
        keys.to(query.dtype).transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
        values.to(query.dtype).transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, Hq, Q, D]
    return out[0].transpose(0, 1)


class TorchAttentionBackend(BaseAttentionBackend):
    name = "torch"

    @property
    def needs_eager_path(self) -> bool:
        """A window, a cap or sinks: neither the C kernel nor SDPA has them (`windowed.py`)."""
        return (
            self.sliding_window is not None
            or self.logit_softcap is not None
            or self.sinks is not None
        )

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [N, BS, Hkv, D]
        v_cache: torch.Tensor,  # [N, BS, Hkv, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        with_kernel = _writes_kv_with_kernel(metadata, key, value, k_cache, v_cache)
        all_valid = None if with_kernel else _all_slots_valid(metadata)  # kernel: unused
        write_kv(key, value, k_cache, v_cache, metadata.slot_mapping, all_valid, with_kernel)
        if self.needs_eager_path:
            return windowed_attention(
                query, k_cache, v_cache, metadata, self.scale, self.sliding_window,
                self.logit_softcap, self.sinks,
            )  # fmt: skip
        if cpu_paged_attention.supports(query, k_cache):
            return self._forward_with_kernel(query, key, value, k_cache, v_cache, metadata)
        if metadata.is_decode_only:
            groups = _decode_groups(metadata, k_cache.shape[1])
            return grouped_decode_attention(query, k_cache, v_cache, groups, self.scale)
        # A mixed step: single-token sequences (decodes) as one batch, chunks one by one.
        out = torch.empty_like(query)
        if metadata.single_token_seqs.numel():
            rows = metadata.single_token_rows
            groups = _decode_groups(metadata, k_cache.shape[1])
            out[rows] = grouped_decode_attention(query[rows], k_cache, v_cache, groups, self.scale)
        self._attend_chunks(
            query, key, value, k_cache, v_cache, metadata, metadata.multi_token_seqs, out
        )
        return out

    def _forward_with_kernel(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [N, BS, Hkv, D]
        v_cache: torch.Tensor,  # [N, BS, Hkv, D]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Short sequences through the C kernel in one call, long chunks through SDPA."""
        split = kernel_split(metadata, query.dtype, query.shape[-1])
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if split.short is not None:
            cpu_paged_attention.attend(split.short, query, k_cache, v_cache, self.scale, out)
        self._attend_chunks(query, key, value, k_cache, v_cache, metadata, split.long, out)
        return out

    def _attend_chunks(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        seqs: list[int],
        out: torch.Tensor,
    ) -> None:
        """`chunk_attention` of each of `seqs` into its rows of `out`."""
        starts, lens = metadata.query_start_list, metadata.seq_lens_list
        for i in seqs:
            start, end = starts[i], starts[i + 1]
            out[start:end] = chunk_attention(
                query[start:end],
                key[start:end],
                value[start:end],
                k_cache,
                v_cache,
                metadata.block_tables[i : i + 1],
                lens[i],
                self.scale,
            )


KV_WRITE_KERNEL_KEY = "torch_kv_write_kernel"
DECODE_GROUPS_KEY = "torch_decode_groups"
ALL_SLOTS_VALID_KEY = "torch_all_slots_valid"
KERNEL_SPLIT_KEY = "torch_kernel_split"


@dataclass(frozen=True, slots=True)
class KernelSplit:
    short: cpu_paged_attention.PreparedStep | None  # the sequences the kernel attends; None: none
    long: list[int]  # sequences attended by `chunk_attention`


def kernel_split(metadata: AttentionMetadata, dtype: torch.dtype, head_dim: int) -> KernelSplit:
    """The step's sequences split by query length (the kernel's: at most
    `cpu_paged_attention.max_query_len` new tokens), decided by the first layer."""
    split = metadata.backend_scratch.get(KERNEL_SPLIT_KEY)
    if split is None:
        max_len = cpu_paged_attention.max_query_len(dtype, head_dim)
        starts = metadata.query_start_list
        lens = [starts[i + 1] - starts[i] for i in range(metadata.num_seqs)]
        limit = max_len if max_len is not None else max(lens, default=0)
        short = [i for i, n in enumerate(lens) if 0 < n <= limit]
        long = [i for i, n in enumerate(lens) if n > limit]
        prepared = None
        if short:
            prepared = cpu_paged_attention.prepare(
                metadata.block_tables,
                metadata.seq_lens,
                metadata.query_start_loc,
                torch.tensor(short, dtype=torch.int32),
            )
        split = KernelSplit(prepared, long)
        metadata.backend_scratch[KERNEL_SPLIT_KEY] = split
    return split


def _decode_groups(metadata: AttentionMetadata, block_size: int) -> list[DecodeGroup]:
    """The step's single-token sequences as planned groups, planned by the first layer."""
    groups = metadata.backend_scratch.get(DECODE_GROUPS_KEY)
    if groups is None:
        if metadata.is_decode_only:
            tables, lens_t, lens = metadata.block_tables, metadata.seq_lens, metadata.seq_lens_list
        else:
            seqs = metadata.single_token_seqs
            tables, lens_t = metadata.block_tables[seqs], metadata.seq_lens[seqs]
            lens = [metadata.seq_lens_list[i] for i in seqs.tolist()]
        groups = plan_decode_groups(tables, lens_t, lens, block_size)
        metadata.backend_scratch[DECODE_GROUPS_KEY] = groups
    return groups


def _writes_kv_with_kernel(
    metadata: AttentionMetadata,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> bool:
    """`cpu_kv_write` takes this step's keys and values, decided by the first layer (every
    layer's have the same shapes, strides and dtypes): its checks cost more than the copy."""
    uses = metadata.backend_scratch.get(KV_WRITE_KERNEL_KEY)
    if uses is None:
        uses = cpu_kv_write.supports(key, value, k_cache, v_cache, metadata.slot_mapping)
        metadata.backend_scratch[KV_WRITE_KERNEL_KEY] = uses
    return uses


def _all_slots_valid(metadata: AttentionMetadata) -> bool:
    """No token of the step is to be skipped (slot -1), found by the first layer."""
    valid = metadata.backend_scratch.get(ALL_SLOTS_VALID_KEY)
    if valid is None:
        valid = not bool((metadata.slot_mapping < 0).any())
        metadata.backend_scratch[ALL_SLOTS_VALID_KEY] = valid
    return valid
