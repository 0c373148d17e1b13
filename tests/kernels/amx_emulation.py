"""The bf16 GEMM kernel's AMX code run on a CPU without AMX: `cpu_small_gemm.c` built with the
tile instructions in software (`amx_emulation.h`), and `cpu_small_gemm` told the CPU has
AMX-BF16, so that every caller (the linears, the fused forward pass, an engine) takes the
AMX tiles as it would on such a CPU. The emulation checks what the hardware faults on; a test
reads `fault(library)` after the tiles ran."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from pathlib import Path

import pytest

from pagedserve.kernels import cpu_small_gemm

HEADER = Path(__file__).with_name("amx_emulation.h")
FLAGS = ("-include", str(HEADER), "-DPAGEDSERVE_AMX_EMULATION")


def emulated_kernel() -> cpu_small_gemm.cpu_build.CKernel:
    return dataclasses.replace(
        cpu_small_gemm.KERNEL, flags=lambda: (*cpu_small_gemm._FLAGS, *FLAGS)
    )


@functools.cache
def emulated_library() -> ctypes.CDLL:
    library = emulated_kernel().loader()()
    if library is None:
        raise RuntimeError("the kernel with emulated AMX tiles did not build (see the log)")
    return library


def use_emulated_amx(monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    """`cpu_small_gemm` as on a CPU with AMX-BF16, the tiles in software, until `monkeypatch`
    undoes it (`forget_amx()` then clears what was cached meanwhile). The library's fault is
    cleared and its product count zeroed."""
    library = emulated_library()
    clear(library)
    monkeypatch.setattr(cpu_small_gemm, "load", functools.cache(lambda: library))
    monkeypatch.setattr(cpu_small_gemm, "cpu_has_amx_bf16", lambda: True)
    forget_amx()
    assert cpu_small_gemm.amx_available()
    return library


def forget_amx() -> None:
    """Clears what `cpu_small_gemm` cached of the CPU's AMX."""
    cpu_small_gemm.amx_available.cache_clear()
    cpu_small_gemm._cpu_has_amx.cache_clear()


def fault(library: ctypes.CDLL) -> str:
    """What the emulated hardware faulted on first, or "" (none since `clear`)."""
    return _message(library).value.decode()


def products(library: ctypes.CDLL) -> int:
    """Tile products (TDPBF16PS) run since `clear`."""
    return ctypes.c_int64.in_dll(library, "amx_emulation_products").value


def clear(library: ctypes.CDLL) -> None:
    ctypes.memset(_message(library), 0, 256)
    ctypes.c_int.in_dll(library, "amx_emulation_faulted").value = 0
    ctypes.c_int64.in_dll(library, "amx_emulation_products").value = 0


def _message(library: ctypes.CDLL) -> ctypes.Array:
    return (ctypes.c_char * 256).in_dll(library, "amx_emulation_fault")
