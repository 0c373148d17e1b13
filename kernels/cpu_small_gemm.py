"""bf16 linears for a few rows on CPUs with AVX512-BF16 (`cpu_small_gemm.c`), built with the
machine's C compiler on first use (`kernels/cpu_build.py`) and loaded through ctypes.

`pack` lays a [N, K] weight out in the kernel's panels once; `linear` multiplies rows by it.
Up to `MAX_ROWS` rows it streams the weights at memory speed where oneDNN's packed product
does not (SmolLM2-135M's linears and LM head, 2 cores: 1 row 47.5 -> 21.8 ms, 8 rows 47.4 ->
31.4, 12 rows 46.2 -> 40.1; from 16 rows oneDNN's AMX product is faster). On a CPU without
AMX oneDNN multiplies with `vdpbf16ps` too, and the kernel stays ahead up to
`MAX_ROWS_WITHOUT_AMX` rows, a CPU step's whole token budget (2-core AMD EPYC, Zen 4: 16 rows
22.4 -> 16.7 ms, 32 rows 32.9 -> 24.3, 64 rows 61.4 -> 47.7, 128 rows 98.7 -> 97.7; Zen 5, the
210 linears of 30 layers: 64 rows 29.5 -> 20.7 ms, 128 41.3 -> 35.9, 256 78.6 -> 72.2, 384
119.8 -> 107.5, 512 146.3 -> 143.6). Every row is then computed the same way whatever else is
in its step, and the steps that carry a prompt chunk got faster: in-process, the 48-request
benchmark at 16 in flight took 3.8% less time (1.025-1.051x over 3 alternated rounds).

Elsewhere (no AVX512-BF16, torch capped below AVX-512, no compiler, a failed build)
`load()` returns None, says why once in the log, and callers keep oneDNN.
`PAGEDSERVE_CPU_GEMM_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from pagedserve.kernels import cpu_build
from pagedserve.kernels.cpu_build import KernelBuildError
from pagedserve.kernels.cpu_packed_product import (
    call_packed_product,
    call_packed_swiglu,
    packed_buffer,
)
from pagedserve.shared.options import switch_on

logger = logging.getLogger(__name__)

MAX_ROWS = 12  # the most rows the vdpbf16ps tiles take beside oneDNN's AMX product
MAX_ROWS_WITHOUT_AMX = 512  # ... where the CPU has no AMX (oneDNN's product is vdpbf16ps too)
AMX_MAX_ROWS = 128  # the most rows the AMX tiles take, where the CPU has AMX-BF16
# the most rows a whole forward pass of these products takes without AMX (fused_max_rows)
FUSED_MAX_ROWS_WITHOUT_AMX = 2048
PANEL_COLUMNS = 32  # NR in the C source
AMX_K_MULTIPLE = 32  # the AMX tiles take K in whole tiles of 32
_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16")
_AMX_FLAGS = ("-mamx-tile", "-mamx-bf16")


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_has_avx512_bf16() -> bool:
    """The CPU has AVX512-BF16 and torch runs at AVX-512 (ATEN_CPU_CAPABILITY not capped)."""
    if not str(torch.backends.cpu.get_cpu_capability()).upper().startswith("AVX512"):
        return False
    return "avx512_bf16" in _cpu_flags()


def cpu_has_amx_bf16() -> bool:
    return cpu_has_avx512_bf16() and "amx_bf16" in _cpu_flags()


def _flags() -> tuple[str, ...]:
    return _FLAGS + (_AMX_FLAGS if cpu_has_amx_bf16() else ())


def _without_avx512_bf16() -> str | None:
    return None if cpu_has_avx512_bf16() else "no AVX512-BF16 at torch's capability"


KERNEL = cpu_build.CKernel(
    source="cpu_small_gemm.c",
    switch="PAGEDSERVE_CPU_GEMM_KERNEL",
    what="CPU bf16 GEMM kernel",
    functions=(
        "small_gemm_packed_numel", "small_gemm_pack", "small_gemm", "small_gemm_amx",
        "small_gemm_amx_init", "small_gemm_swiglu", "silu_and_mul",
    ),
    flags=_flags,
    unsupported=_without_avx512_bf16,
)  # fmt: skip
SOURCE = KERNEL.path
load = KERNEL.loader()


@functools.cache
def amx_available() -> bool:
    """The library was built with AMX and Linux lets this process use the tiles."""
    library = load()
    if library is None or not cpu_has_amx_bf16() or switched_off_amx():
        return False
    if library.small_gemm_amx_init() != 0:
        logger.warning("CPU bf16 GEMM kernel: Linux refused the AMX tile state; not using AMX")
        return False
    return True


def switched_off_amx() -> bool:
    return not switch_on("PAGEDSERVE_CPU_GEMM_AMX")


def max_rows(num_in: int) -> int:
    """The most rows `linear` takes for a weight of `num_in` columns."""
    if num_in % AMX_K_MULTIPLE == 0 and amx_available():
        return AMX_MAX_ROWS
    return MAX_ROWS if _cpu_has_amx() else MAX_ROWS_WITHOUT_AMX


def fused_max_rows(num_in: int) -> int:
    """The most rows a forward pass made of this kernel's calls (the CPU platform's fused
    forward) takes for a weight of `num_in` columns. Without AMX, more than `linear` alone:
    past `MAX_ROWS_WITHOUT_AMX` oneDNN's packed product is 2-4.5% faster product for product
    (`benchmarks/cpu_linears.py --rows 512,1024,2048`: 349 / 701 / 1378 ms against 360 / 714
    / 1440 for SmolLM2's 121 products, Zen 4), but a pass in these kernels keeps the MLP's
    [rows, 2 x intermediate] product out of memory: a prompt token in 2048-row steps cost
    586 us against 675 through the modules (`benchmarks/prefill_budget.py`, 2 alternated
    rounds), no more than in 512-row steps (603)."""
    if _cpu_has_amx():  # the AMX tiles' rows, or beside oneDNN's AMX product
        return max_rows(num_in)
    return FUSED_MAX_ROWS_WITHOUT_AMX


@functools.cache
def _cpu_has_amx() -> bool:
    return cpu_has_amx_bf16()


def _library() -> ctypes.CDLL:
    library = load()
    if library is None:
        raise KernelBuildError("the CPU bf16 GEMM kernel is not available")
    return library


def packed_numel(num_out: int, num_in: int) -> int:
    """bf16 elements a packed [num_out, num_in] weight takes (`small_gemm_packed_numel` in C:
    32-column panels, K rounded up to pairs), without a call into the library per product."""
    return -(-num_out // PANEL_COLUMNS) * PANEL_COLUMNS * ((num_in + 1) // 2 * 2)


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A bf16 [N, K] weight in the kernel's panel layout (a flat bf16 tensor), written into
    `out` where given (`packed_numel(N, K)` contiguous elements: a slice of an arena)."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"expected a 2-D bf16 CPU weight, got {weight.dtype} {weight.shape}")
    library = _library()
    weight = weight.detach().contiguous()
    num_out, num_in = weight.shape
    numel = library.small_gemm_packed_numel(num_out, num_in)
    packed = packed_buffer(numel, torch.bfloat16, out)
    library.small_gemm_pack(weight.data_ptr(), num_out, num_in, packed.data_ptr())
    return packed


def linear(
    x: torch.Tensor,  # [..., K] bf16
    packed: torch.Tensor,  # `pack(weight)`
    num_out: int,  # N, the weight's row count
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [..., N] bf16
    """x W^T (+ b) through a packed weight."""
    num_in = x.shape[-1]
    if x.dtype != torch.bfloat16 or packed.numel() != packed_numel(num_out, num_in):
        raise ValueError(
            f"x ({x.dtype}, {num_in} columns) does not fit a packed [{num_out}, K] bf16 weight"
        )
    return call_packed_product(product_for(num_in), x, packed, num_out, bias, torch.bfloat16)


def product_for(num_in: int) -> Callable[..., None]:
    """The library's product for a weight of `num_in` columns: the AMX tiles where the CPU
    has them and they take K, else the `vdpbf16ps` tiles (one C signature, see
    `cpu_packed_product.py`)."""
    library = _library()
    return library.small_gemm_amx if uses_amx(num_in) else library.small_gemm


def uses_amx(num_in: int) -> bool:
    return num_in % AMX_K_MULTIPLE == 0 and amx_available()


def takes_mlp(num_rows: int, num_in: int, num_inter: int) -> bool:
    """The kernel serves this MLP's gate-and-up product and its activation: it is built,
    takes this many rows, and the width is whole panels. Fused (`swiglu`) where it multiplies
    with the `vdpbf16ps` tiles; where the AMX tiles take K (faster than fusing on these), the
    AMX product and then `silu_and_mul`, with the same bits."""
    return load() is not None and num_inter % PANEL_COLUMNS == 0 and num_rows <= max_rows(num_in)


def fuses_swiglu(num_rows: int, num_in: int, num_inter: int) -> bool:
    """`swiglu` serves this product (see `takes_mlp`)."""
    return takes_mlp(num_rows, num_in, num_inter) and not uses_amx(num_in)


def swiglu(
    x: torch.Tensor,  # [..., K] bf16
    packed: torch.Tensor,  # `pack` of the merged [2 * num_inter, K] gate-and-up weight
    num_inter: int,  # the MLP's width: the gate's (and the up's) row count
) -> torch.Tensor:  # [..., num_inter] bf16
    """silu(x Wg^T) * (x Wu^T) of a merged gate-and-up weight in one pass, rounded as torch
    rounds those ops on bf16 tensors (see `small_gemm_swiglu` in the C source)."""
    library = _library()
    num_in = x.shape[-1]
    if num_inter % PANEL_COLUMNS or x.dtype != torch.bfloat16:
        raise ValueError(
            f"needs bf16 rows and a width that is a multiple of {PANEL_COLUMNS}, "
            f"got {x.dtype} and {num_inter}"
        )
    if packed.numel() != packed_numel(2 * num_inter, num_in):
        raise ValueError(f"x ({num_in} columns) does not fit a packed [{2 * num_inter}, K] weight")
    return call_packed_swiglu(library.small_gemm_swiglu, x, packed, num_inter, torch.bfloat16)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2 * num_inter] bf16
    """silu(gate) * up of a merged product's output (its first half the gate's, its second
    the up's), rounded as `swiglu` rounds it; [..., num_inter] bf16."""
    num_inter = gate_up.shape[-1] // 2
    if gate_up.dtype != torch.bfloat16 or num_inter % PANEL_COLUMNS or gate_up.shape[-1] % 2:
        raise ValueError(
            f"needs bf16 rows of two halves, each a multiple of {PANEL_COLUMNS} wide; got "
            f"{gate_up.dtype} rows of {gate_up.shape[-1]}"
        )
    rows = gate_up.reshape(-1, 2 * num_inter)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], num_inter, dtype=torch.bfloat16)
    _library().silu_and_mul(
        rows.data_ptr(), rows.shape[0], num_inter, rows.stride(0), out.data_ptr(), num_inter
    )
    return out.view(*gate_up.shape[:-1], num_inter)
