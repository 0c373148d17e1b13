"""Paged attention ops. The Triton modules are imported on first call, so that
`import kernels` and `import kernels.reference` work where Triton is absent (the CPU serving
path uses `kernels.reference`). Signatures mirror `kernels.reference`, with optional
keyword-only launch hints."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def write_kv_cache(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, -1: skip
) -> None:
    """Triton `reference.write_kv_cache`."""
    from pagedserve.kernels.kv_cache_write import write_kv_cache as launch

    launch(key, value, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    query: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    *,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Triton `reference.paged_decode_attention`; see `kernels.paged_decode`."""
    from pagedserve.kernels.paged_decode import paged_decode_attention as launch

    return launch(
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        scale,
        num_splits=num_splits,
        max_seq_len=max_seq_len,
        out=out,
    )


def paged_prefill_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    *,
    max_query_len: int | None = None,
    work_items: torch.Tensor | None = None,
    grid: str = "flat",
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    """Triton `reference.paged_prefill_attention`; see `kernels.paged_prefill`."""
    from pagedserve.kernels.paged_prefill import paged_prefill_attention as launch

    return launch(
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        max_query_len=max_query_len,
        work_items=work_items,
        grid=grid,
        out=out,
    )


__all__ = ["paged_decode_attention", "paged_prefill_attention", "write_kv_cache"]
