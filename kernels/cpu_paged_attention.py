"""Paged attention on the CPU in one pass over the cache (`cpu_paged_attention.c`), built with
the machine's C compiler on first use and loaded through ctypes.

The torch backend's decode attention gathers every sequence's K/V out of the paged cache
into a padded copy and has SDPA read that copy again: at 48 sequences of ~170 tokens on 2
AVX2 cores, 120 of a 350 ms step. This kernel reads each cached row once, in place.

Built with the machine's C compiler on first use and cached (`kernels/cpu_build.py`).

No compiler, or a failed build: `load()` returns None, says why once in the log, and the
backend keeps its torch path. `PAGEDSERVE_CPU_ATTENTION_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedserve.kernels import cpu_build
from pagedserve.kernels.cpu_build import KernelBuildError, compile_flags
from pagedserve.kernels.cpu_small_gemm import cpu_has_avx512_bf16
from pagedserve.shared.options import switch_on

__all__ = ["KernelBuildError", "compile_flags"]

DTYPES = (torch.float32, torch.bfloat16)  # the cache and query dtypes it reads


def enabled() -> bool:
    return switch_on(KERNEL.switch)


def extra_flags() -> tuple[str, ...]:
    """`-mavx512bf16` where the CPU has AVX512-BF16 at torch's capability: bf16 caches are
    then scored with `vdpbf16ps` (see the C source)."""
    return ("-mavx512bf16",) if cpu_has_avx512_bf16() else ()


KERNEL = cpu_build.CKernel(
    source="cpu_paged_attention.c",
    switch="PAGEDSERVE_CPU_ATTENTION_KERNEL",
    what="CPU paged attention kernel",
    functions=(
        "paged_attention",
        "paged_attention_uses_bf16_dot",
        "paged_attention_takes_any_chunk",
        "paged_attention_set_single_decodes_by_sequence",
    ),
    flags=extra_flags,
)
SOURCE = KERNEL.path
load = KERNEL.loader()


def build(directory: Path | None = None) -> Path:
    """The compiled library's path (see `cpu_build.build`). Raises `KernelBuildError`."""
    return KERNEL.build(directory)


def uses_bf16_dot(head_dim: int = 64) -> bool:
    """Whether the loaded kernel scores bf16 caches of heads of `head_dim` with `vdpbf16ps`
    (built for a CPU with AVX512-BF16; head_dim a multiple of 64, at most 256)."""
    library = load()
    return library is not None and bool(library.paged_attention_uses_bf16_dot(head_dim))


def set_single_decodes_by_sequence(on: bool) -> bool | None:
    """Whether the loaded kernel attends a float32 cache's single-token decodes by sequence
    (all KV heads in one pass) or by (sequence, KV head) pair, for this process: which is faster
    follows the core's L2 (see the C source; the worker decides, `platforms/cpu.py`). The same
    bits either way. Returns the setting, None where the kernel is not loaded."""
    library = load()
    if library is None:
        return None
    return bool(library.paged_attention_set_single_decodes_by_sequence(int(on)))


# The most new tokens of one sequence the kernel attends where it has no lanes for longer
# chunks (a bf16 cache without AVX512-BF16, head_dim past the lanes'); longer chunks go through
# SDPA. One chunk, AVX2 fp32, 2 threads, 100 cached tokens, scored by row: the kernel is 2.4x
# SDPA's time at 2 new tokens, 1.4x at 16, even at 32, 0.5x at 64 (its scores are dot products,
# SDPA's a GEMM).
SHORT_QUERY_LEN = 16


def takes_any_chunk(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the loaded kernel attends chunks of any length of this dtype and head_dim: on
    the `vdpbf16ps` path's lanes (bf16, head_dim a multiple of 64 up to 256), or a float32
    chunk of more than SHORT_QUERY_LEN tokens on float32 lanes (head_dim a multiple of 8 up to
    256), both several times faster than SDPA on a prompt."""
    library = load()
    return library is not None and bool(
        library.paged_attention_takes_any_chunk(head_dim, int(dtype == torch.bfloat16))
    )


def max_query_len(dtype: torch.dtype, head_dim: int) -> int | None:
    """The longest chunk (new tokens of one sequence) worth attending with this kernel rather
    than SDPA; None: any (`takes_any_chunk`)."""
    return None if takes_any_chunk(dtype, head_dim) else SHORT_QUERY_LEN


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel can serve this layer: CPU tensors of one supported dtype, head_dim a
    multiple of 8."""
    return (
        query.device.type == "cpu"
        and k_cache.dtype in DTYPES
        and query.dtype == k_cache.dtype
        and query.shape[-1] % 8 == 0
        and load() is not None
    )


@dataclass(frozen=True, slots=True)
class PreparedStep:
    """What every layer's call in one step shares, in the form the kernel takes (a step runs
    30 layers or so: converting these once saves that many times the Python work)."""

    tensors: tuple[torch.Tensor, ...]  # kept alive while the pointers below are used
    args: tuple[int, ...]  # block_tables, max_blocks, seq_lens, query_start, seqs, num_seqs


def prepare(
    block_tables: torch.Tensor,  # [S, max_blocks] int32
    seq_lens: torch.Tensor,  # [S] int32, context after this step's writes
    query_start_loc: torch.Tensor,  # [S + 1] int32
    seqs: torch.Tensor | None = None,  # [n]: attend only these sequences; None: all
) -> PreparedStep:
    tables, lens, starts = _int32(block_tables), _int32(seq_lens), _int32(query_start_loc)
    seqs = _int32(torch.arange(lens.shape[0]) if seqs is None else seqs)
    args = (tables.data_ptr(), tables.shape[1], lens.data_ptr(), starts.data_ptr(),
            seqs.data_ptr(), seqs.shape[0])  # fmt: skip
    return PreparedStep((tables, lens, starts, seqs), args)


def attend(
    step: PreparedStep,
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    scale: float,
    out: torch.Tensor | None = None,  # [T, Hq, D]: written at the attended rows only
) -> torch.Tensor:  # [T, Hq, D]
    """Causal attention of each of the step's sequences' new tokens over its paged context, as
    `kernels.reference.paged_prefill_attention` (a decode is one new token). Needs `supports`."""
    library = load()
    if library is None:
        raise KernelBuildError("the CPU paged attention kernel is not available")
    num_tokens, num_heads, head_dim = query.shape
    if query.stride(2) != 1 or query.stride(1) != head_dim:
        query = query.contiguous()
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not tensor.is_contiguous() or tensor.dtype != query.dtype:
            raise ValueError(f"{name} must be contiguous and of the query's dtype {query.dtype}")
    if out is None:
        out = torch.empty(num_tokens, num_heads, head_dim, dtype=query.dtype)
    elif out.shape != query.shape or out.dtype != query.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {query.dtype} tensor of shape {query.shape}")
    call_library(library, step, query, k_cache, v_cache, scale, out)
    return out


def call_library(
    library: ctypes.CDLL,
    step: PreparedStep,
    query: torch.Tensor,  # [T, Hq, D], rows of heads contiguous
    k_cache: torch.Tensor,  # [N, BS, Hkv, D], contiguous
    v_cache: torch.Tensor,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D], contiguous
) -> None:
    """The C call itself, on arguments `attend` has checked (a benchmark passes another build
    of the kernel as `library`)."""
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    tables, max_blocks, lens, starts, seqs, num_seqs = step.args
    status = library.paged_attention(
        out.data_ptr(), query.data_ptr(), query.stride(0), k_cache.data_ptr(),
        v_cache.data_ptr(), tables, max_blocks, lens, starts, seqs, num_seqs, num_heads,
        num_kv_heads, head_dim, block_size, scale, int(query.dtype == torch.bfloat16),
    )  # fmt: skip
    if status != 0:
        raise MemoryError("the CPU paged attention kernel could not allocate its scratch memory")


def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [N, BS, Hkv, D]
    v_cache: torch.Tensor,  # [N, BS, Hkv, D]
    block_tables: torch.Tensor,  # [S, max_blocks] int32
    seq_lens: torch.Tensor,  # [S] int32, context after this step's writes
    query_start_loc: torch.Tensor,  # [S + 1] int32
    scale: float,
    seqs: torch.Tensor | None = None,  # [n] int32: attend only these sequences
    out: torch.Tensor | None = None,  # [T, Hq, D]: written at the attended rows only
) -> torch.Tensor:  # [T, Hq, D]
    """`attend` for one call: `prepare` and `attend` in one."""
    step = prepare(block_tables, seq_lens, query_start_loc, seqs)
    return attend(step, query, k_cache, v_cache, scale, out)


def _int32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.int32).contiguous()
