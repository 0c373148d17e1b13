"""float32 linears for a few dozen rows on CPUs with AVX2 and FMA (`cpu_small_sgemm.c`), built
with the machine's C compiler on first use (`kernels/cpu_build.py`) and loaded through ctypes.

`pack` lays a [N, K] weight out in the kernel's panels once; `linear` multiplies rows by it.
Every output is one fused multiply-add chain over k, whatever the batch: a row's outputs do
not depend on the rows beside it, or on the vector width the library was built for.

Elsewhere (torch below AVX2, no compiler, a failed build) `load()` returns None, says why once
in the log, and callers keep MKL. `PAGEDSERVE_CPU_SGEMM_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pagedserve.kernels import cpu_build
from pagedserve.kernels.cpu_build import KernelBuildError
from pagedserve.kernels.cpu_packed_product import (
    call_packed_product,
    call_packed_swiglu,
    packed_buffer,
)


def _below_avx2() -> str | None:
    if str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"):
        return "torch runs below AVX2"
    return None


KERNEL = cpu_build.CKernel(
    source="cpu_small_sgemm.c",
    switch="PAGEDSERVE_CPU_SGEMM_KERNEL",
    what="CPU float32 GEMM kernel",
    functions=(
        "small_sgemm_panel_columns", "small_sgemm_packed_numel", "small_sgemm_pack", "small_sgemm",
        "small_sgemm_swiglu",
    ),
    unsupported=_below_avx2,
)  # fmt: skip
SOURCE = KERNEL.path
load = KERNEL.loader()


def available() -> bool:
    return load() is not None


def _library() -> ctypes.CDLL:
    library = load()
    if library is None:
        raise KernelBuildError("the CPU float32 GEMM kernel is not available")
    return library


@functools.cache
def _panel_columns() -> int:
    return int(_library().small_sgemm_panel_columns())


def packed_numel(num_out: int, num_in: int) -> int:
    """float32 elements a packed [num_out, num_in] weight takes (`small_sgemm_packed_numel` in
    C), without a call into the library per product."""
    columns = _panel_columns()
    return -(-num_out // columns) * columns * num_in


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A float32 [N, K] weight in the kernel's panel layout (a flat float32 tensor), written into
    `out` where given (`packed_numel(N, K)` contiguous elements: a slice of an arena)."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"expected a 2-D float32 CPU weight, got {weight.dtype} {weight.shape}")
    library = _library()
    weight = weight.detach().contiguous()
    num_out, num_in = weight.shape
    numel = library.small_sgemm_packed_numel(num_out, num_in)
    packed = packed_buffer(numel, torch.float32, out)
    library.small_sgemm_pack(weight.data_ptr(), num_out, num_in, packed.data_ptr())
    return packed


def linear(
    x: torch.Tensor,  # [..., K] float32
    packed: torch.Tensor,  # `pack(weight)`
    num_out: int,  # N, the weight's row count
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N] float32
    """x W^T (+ b) through a packed weight."""
    library = _library()
    num_in = x.shape[-1]
    if x.dtype != torch.float32 or packed.numel() != packed_numel(num_out, num_in):
        raise ValueError(
            f"x ({x.dtype}, {num_in} columns) does not fit a packed [{num_out}, K] float32 weight"
        )
    return call_packed_product(library.small_sgemm, x, packed, num_out, bias, torch.float32)


def takes_swiglu(num_inter: int) -> bool:
    """`swiglu` takes an MLP of this width: the kernel is built and the width is whole panels
    (gate panel p and up panel p + num_inter / panel columns cover the same columns)."""
    return available() and num_inter % _panel_columns() == 0


def swiglu(
    x: torch.Tensor,  # [..., K] float32
    packed: torch.Tensor,  # `pack` of the merged [2 * num_inter, K] gate-and-up weight
    num_inter: int,  # the MLP's width: the gate's (and the up's) row count
) -> torch.Tensor:  # [..., num_inter] float32
    """silu(x Wg^T) * (x Wu^T) of a merged gate-and-up weight in one pass: the products'
    sums are `linear`'s, silu is torch's formula (see `small_sgemm_swiglu` in the C source)."""
    library = _library()
    num_in = x.shape[-1]
    if x.dtype != torch.float32 or num_inter % _panel_columns():
        raise ValueError(
            f"needs float32 rows and a width that is a multiple of {_panel_columns()}, "
            f"got {x.dtype} and {num_inter}"
        )
    if packed.numel() != packed_numel(2 * num_inter, num_in):
        raise ValueError(f"x ({num_in} columns) does not fit a packed [{2 * num_inter}, K] weight")
    return call_packed_swiglu(library.small_sgemm_swiglu, x, packed, num_inter, torch.float32)
