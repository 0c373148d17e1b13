"""The few-row bf16 GEMM (kernels/cpu_small_gemm.c), its vdpbf16ps and AMX tiles (in software
where the CPU has none), against float64 products and oneDNN, and the fallback where the CPU
has no AVX512-BF16."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_small_gemm
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from tests.kernels import amx_emulation


@pytest.fixture(autouse=True)
def fresh_load():
    cpu_small_gemm.load.cache_clear()
    yield
    cpu_small_gemm.load.cache_clear()


requires_avx512_bf16 = pytest.mark.skipif(
    not cpu_small_gemm.cpu_has_avx512_bf16(),
    reason="the kernel is built only for CPUs with AVX512-BF16 (the fallback is tested below)",
)


def exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


HAS_AMX = cpu_small_gemm.cpu_has_amx_bf16()
requires_amx = pytest.mark.skipif(not HAS_AMX, reason="the AMX tiles need a CPU with AMX-BF16")
without_amx = pytest.mark.skipif(HAS_AMX, reason="this CPU runs the AMX tiles themselves")


@pytest.fixture(
    params=[
        "vdpbf16ps",
        pytest.param("amx", marks=requires_amx),
        pytest.param("emulated amx", marks=without_amx),
    ]
)
def tiles(request, monkeypatch):
    """Each of the kernel's two products: AMX off, or on: the CPU's tiles where it has them,
    else the same C code on tiles in software (`amx_emulation.h`), which must not fault."""
    if request.param == "vdpbf16ps":
        monkeypatch.setenv("PAGEDSERVE_CPU_GEMM_AMX", "0")
    emulated = request.param == "emulated amx"
    library = amx_emulation.use_emulated_amx(monkeypatch) if emulated else None
    cpu_small_gemm.amx_available.cache_clear()
    assert cpu_small_gemm.amx_available() == (request.param != "vdpbf16ps")
    yield request.param
    amx_emulation.forget_amx()
    if library is not None:
        assert amx_emulation.fault(library) == ""


@requires_avx512_bf16
@pytest.mark.parametrize("rows", [*range(1, 14), 16, 17, 31, 32, 33, 64, 100])
@pytest.mark.parametrize(("num_out", "num_in"), [(96, 64), (37, 77), (576, 1536), (50, 96)])
def test_matches_an_exact_product_to_bf16_rounding(tiles, rows, num_out, num_in):
    """Every tile height, partial panels, odd K (vdpbf16ps only: AMX takes K in 32s)."""
    torch.manual_seed(rows * num_in)
    weight = (torch.randn(num_out, num_in) / num_in**0.5).bfloat16()
    bias = torch.randn(num_out).bfloat16()
    x = torch.randn(rows, num_in).bfloat16()
    out = cpu_small_gemm.linear(x, cpu_small_gemm.pack(weight), num_out, bias)
    assert cpu_small_gemm.uses_amx(num_in) == (tiles != "vdpbf16ps" and num_in % 32 == 0)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, num_out)
    expected = exact(x, weight, bias)
    # one rounding to bf16 (2^-8 relative) on top of float32 sums
    assert ((out.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-3).all()
    onednn = torch.ops.mkldnn._linear_pointwise(
        x, torch.ops.mkldnn._reorder_linear_weight(weight, 1), bias, "none", [], ""
    )
    assert (out != onednn).float().mean() < 0.01  # the same but for rare last-bit roundings


@requires_avx512_bf16
def test_strided_and_batched_inputs(tiles):
    weight = torch.randn(40, 24).bfloat16()
    x = torch.randn(2, 3, 48).bfloat16()[..., ::2]  # [2, 3, 24], every other column
    out = cpu_small_gemm.linear(x, cpu_small_gemm.pack(weight), 40)
    assert out.shape == (2, 3, 40)
    expected = exact(x.reshape(6, 24), weight, None).reshape(2, 3, 40)
    assert ((out.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-3).all()


@requires_avx512_bf16
def test_bad_inputs_are_refused():
    packed = cpu_small_gemm.pack(torch.randn(8, 16).bfloat16())
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_gemm.linear(torch.randn(2, 16), packed, 8)  # float32 rows
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_gemm.linear(torch.randn(2, 18).bfloat16(), packed, 8)  # wrong K
    with pytest.raises(ValueError, match="expected a 2-D bf16"):
        cpu_small_gemm.pack(torch.randn(8, 16))


@requires_avx512_bf16
@pytest.mark.parametrize("num_in", [32, 40])  # AMX's K (where it has AMX), and not
def test_layers_use_it_up_to_max_rows_and_onednn_beyond(tiles, num_in, monkeypatch):
    weight = torch.randn(64, num_in).bfloat16()
    packing = cpu_prepack.pack_weight(weight)
    assert isinstance(packing, cpu_prepack.Bf16Packing) and packing.few_rows is not None
    most = cpu_small_gemm.max_rows(num_in)
    amx = tiles != "vdpbf16ps" and num_in == 32
    beside_amx = cpu_small_gemm.cpu_has_amx_bf16()  # oneDNN's AMX product takes more rows
    expected = cpu_small_gemm.MAX_ROWS if beside_amx else cpu_small_gemm.MAX_ROWS_WITHOUT_AMX
    assert most == (cpu_small_gemm.AMX_MAX_ROWS if amx else expected)
    # a forward pass of these kernels takes more rows where the CPU has no AMX
    fused = most if amx or beside_amx else cpu_small_gemm.FUSED_MAX_ROWS_WITHOUT_AMX
    assert cpu_small_gemm.fused_max_rows(num_in) == fused
    assert (packing.onednn is None) == amx  # past the AMX tiles' rows F.linear is as fast
    calls = []
    real = cpu_small_gemm.linear
    monkeypatch.setattr(cpu_small_gemm, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    for rows in (1, most, most + 1, most + 40):
        x = torch.randn(rows, num_in).bfloat16()
        out = cpu_prepack.linear(x, weight, None, packing)
        expected = exact(x, weight, None)
        assert ((out.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-3).all()
    assert len(calls) == 2


def test_without_avx512_bf16_bf16_layers_keep_onednn(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 (or an AVX2-only CPU): no kernel, oneDNN's packing alone."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not cpu_small_gemm.cpu_has_avx512_bf16()
    assert cpu_small_gemm.load() is None
    weight = torch.randn(16, 8).bfloat16()
    if cpu_prepack.can_prepack(weight):
        packing = cpu_prepack.pack_weight(weight)
        assert packing.few_rows is None
        x = torch.randn(2, 8).bfloat16()
        assert torch.equal(
            cpu_prepack.linear(x, weight, None, packing), torch.nn.functional.linear(x, weight)
        )


@requires_avx512_bf16
def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_GEMM_KERNEL", "0")
    assert cpu_small_gemm.load() is None


@requires_avx512_bf16
def test_the_python_packed_size_is_the_librarys():
    library = cpu_small_gemm.load()
    for num_out, num_in in [(1, 1), (32, 64), (37, 77), (49152, 576), (33, 1)]:
        assert cpu_small_gemm.packed_numel(num_out, num_in) == library.small_gemm_packed_numel(
            num_out, num_in
        )
