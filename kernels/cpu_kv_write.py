"""Writing a step's new keys and values into the paged cache on the CPU in one call
(`cpu_kv_write.c`), built with the machine's C compiler on first use (`kernels/cpu_build.py`)
and loaded through ctypes. The cache ends up as `index_copy_` into its slots leaves it;
tokens whose slot is -1 are skipped.

No compiler, or a failed build: `load()` returns None, says why once in the log, and the
attention backend keeps torch's ops. `PAGEDSERVE_CPU_KV_WRITE_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import torch

from pagedserve.kernels import cpu_build

KERNEL = cpu_build.CKernel(
    source="cpu_kv_write.c",
    switch="PAGEDSERVE_CPU_KV_WRITE_KERNEL",
    what="CPU KV cache write kernel",
    functions=("write_kv_rows",),
)
load = KERNEL.loader()


def _rows_in_place(rows: torch.Tensor, row_elems: int) -> bool:
    """[T, Hkv, D] with each token's heads contiguous (tokens may be further apart)."""
    return (
        rows.stride(2) == 1
        and rows.stride(1) == rows.shape[2]
        and rows.shape[1:].numel() == row_elems
    )


def supports(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T]
) -> bool:
    """The kernel can write these rows: CPU tensors of the caches' dtype, caches contiguous,
    each token's heads contiguous in key and value alike, int64 slots."""
    tensors = (key, value, k_cache, v_cache, slot_mapping)
    row_elems = k_cache.shape[2] * k_cache.shape[3]
    return (
        all(t.device.type == "cpu" for t in tensors)
        and key.dtype == value.dtype == k_cache.dtype == v_cache.dtype
        and k_cache.shape == v_cache.shape
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and key.shape == value.shape
        and key.stride(0) == value.stride(0)
        and _rows_in_place(key, row_elems)
        and _rows_in_place(value, row_elems)
        and slot_mapping.dtype == torch.int64
        and slot_mapping.is_contiguous()
        and slot_mapping.shape == key.shape[:1]
        and load() is not None
    )


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Token t's keys and values into slot `slot_mapping[t]` of the caches (skipped where it
    is -1). Needs `supports(...)`. A slot past the caches raises ValueError, nothing written."""
    num_tokens = key.shape[0]
    if not num_tokens:
        return
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    status = load().write_kv_rows(
        key.data_ptr(), value.data_ptr(), key.stride(0), k_cache.data_ptr(),
        v_cache.data_ptr(), num_slots, slot_mapping.data_ptr(), num_tokens,
        k_cache.shape[2] * k_cache.shape[3], k_cache.element_size(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"a slot of {slot_mapping.tolist()} is past the caches' {num_slots}")
