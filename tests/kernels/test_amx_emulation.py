"""The AMX tiles in software (`amx_emulation.h`) that run the kernel's AMX code on CPUs without
AMX: every row count the tiles take gives the exact product to bf16 rounding with the tile
products counted, and the kernel's AMX code with one of its rules broken faults as the CPU
would (the emulation names the instruction) rather than passing."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from pagedserve.kernels import cpu_build, cpu_small_gemm
from pagedserve.kernels.cpu_packed_product import call_packed_product
from tests.kernels import amx_emulation

pytestmark = pytest.mark.skipif(
    not cpu_small_gemm.cpu_has_avx512_bf16(),
    reason="the kernel, emulated tiles and all, is built only for CPUs with AVX512-BF16",
)


def exact(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.double() @ weight.double().T


def amx_product(library: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    packed = cpu_small_gemm.pack(weight)
    return call_packed_product(
        library.small_gemm_amx, x, packed, weight.shape[0], None, torch.bfloat16
    )


def close_to_exact(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> bool:
    expected = exact(x, weight)
    return bool(((out.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-3).all())


def test_every_row_count_the_tiles_take_multiplies_exactly():
    """1 to 128 rows (one or two 16-row tiles a block, partial tiles, several blocks), two
    panels and a partial third, K of three tiles; each block of 32 rows or fewer takes, per
    32-wide panel, two products per 32 of K and two more where it has a second tile."""
    library = amx_emulation.emulated_library()
    weight = (torch.randn(80, 96) / 96**0.5).bfloat16()
    for rows in range(1, cpu_small_gemm.AMX_MAX_ROWS + 1):
        amx_emulation.clear(library)
        x = torch.randn(rows, 96).bfloat16()
        out = amx_product(library, x, weight)
        assert amx_emulation.fault(library) == "", rows
        assert close_to_exact(out, x, weight), rows
        blocks, last = divmod(rows, 32)
        tiles = 2 * blocks + (0 if last == 0 else 1 if last <= 16 else 2)
        assert amx_emulation.products(library) == 3 * 3 * 2 * tiles, rows


def test_the_tiles_read_strided_rows():
    library = amx_emulation.emulated_library()
    weight = torch.randn(64, 64).bfloat16()
    x = torch.randn(40, 128).bfloat16()[:, 32:96]  # rows 128 apart
    out = amx_product(library, x, weight)
    assert amx_emulation.fault(library) == "" and close_to_exact(out, x, weight)


def kernel_with(tmp_path: Path, old: str, new: str) -> ctypes.CDLL:
    """The kernel with `old` (which must be in it) replaced by `new`, on emulated tiles."""
    source = cpu_small_gemm.SOURCE.read_text()
    assert source.count(old) == 1, f"the kernel no longer has {old!r}"
    broken = tmp_path / "cpu_small_gemm.c"
    broken.write_text(source.replace(old, new))
    flags = (*cpu_small_gemm._FLAGS, *amx_emulation.FLAGS, "-I", str(cpu_small_gemm.SOURCE.parent))
    library = ctypes.CDLL(str(cpu_build.build(broken, tmp_path, flags)))
    function = library.small_gemm_amx
    function.restype, function.argtypes = cpu_build.c_signature(source, "small_gemm_amx")
    return library


BROKEN_RULES = {
    "a tile that is not used has bytes per row": (
        "config.colsb[t] = rows[t] ? 64 : 0;",
        "config.colsb[t] = 64;",
        "LDTILECFG: a tile's rows or bytes per row out of range (#GP) (tile 2)",
    ),
    "the second row tile is zeroed where the block has no second": (
        "if (rows1) {\n        _tile_zero(2);",
        "{\n        _tile_zero(2);",
        "TILEZERO: tiles not configured, or this one unused (#UD) (tile 2)",
    ),
    "the tiles are never configured": (
        "                    configure(rows0, rows1);\n",
        "",
        "TILEZERO: tiles not configured, or this one unused (#UD) (tile 0)",
    ),
    "a product of 16-row accumulators with the second, shorter rows tile": (
        "_tile_dpbf16ps(0, 4, 6);",
        "_tile_dpbf16ps(0, 5, 6);",
        "TDPBF16PS: tiles not configured, unused, or shapes that do not fit (#UD) (tile 0)",
    ),
}


@pytest.mark.parametrize("rule", BROKEN_RULES)
def test_the_kernel_with_a_rule_broken_faults_as_the_cpu_would(rule, tmp_path):
    old, new, expected = BROKEN_RULES[rule]
    library = kernel_with(tmp_path, old, new)
    amx_emulation.clear(library)
    x = torch.randn(20 if "shorter" in rule else 9, 64).bfloat16()
    amx_product(library, x, torch.randn(32, 64).bfloat16())
    assert amx_emulation.fault(library) == expected


def test_the_unbroken_kernel_does_not_fault_on_the_same_rows(tmp_path):
    library = kernel_with(tmp_path, "configure(rows0, rows1);", "configure(rows0, rows1);")
    amx_emulation.clear(library)
    for rows in (9, 20):
        x = torch.randn(rows, 64).bfloat16()
        weight = torch.randn(32, 64).bfloat16()
        assert close_to_exact(amx_product(library, x, weight), x, weight)
    # K of two tiles, one panel: 9 rows take one rows tile (2 x 2 products), 20 take two
    assert amx_emulation.fault(library) == "" and amx_emulation.products(library) == 4 + 8
