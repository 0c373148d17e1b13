"""The float32 GEMM (kernels/cpu_small_sgemm.c) against float64 products, its batch
invariance, its AVX2 and AVX-512 builds, how the layers use it beside MKL, and the fallback."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_build, cpu_small_sgemm
from pagedserve.services.gpu_worker.platforms import cpu_prepack

pytestmark = pytest.mark.usefixtures("fresh_sgemm_load")  # tests/kernels/conftest.py


requires_kernel = pytest.mark.skipif(
    str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"),
    reason="the kernel is built for CPUs with AVX2 (the fallback is tested below)",
)


def assert_close_to_exact(out, x, weight, bias):
    expected = x.double() @ weight.double().T
    if bias is not None:
        expected = expected + bias.double()
    # float32 sums of K products: each within K float32 roundings of its terms' magnitudes
    magnitude = x.double().abs() @ weight.double().abs().T
    bound = magnitude * x.shape[-1] * 2**-24 + 1e-6
    assert ((out.double() - expected).abs() <= bound).all()


@requires_kernel
@pytest.mark.parametrize("rows", [*range(1, 14), 16, 17, 31, 32, 33, 64, 100, 200])
@pytest.mark.parametrize(("num_out", "num_in"), [(96, 64), (37, 77), (576, 1536), (50, 1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_an_exact_product(rows, num_out, num_in, with_bias):
    """Every tile height (6 rows in AVX2 builds, 12 in AVX-512 ones), partial panels, odd K."""
    torch.manual_seed(rows * num_in)
    weight = torch.randn(num_out, num_in) / num_in**0.5
    bias = torch.randn(num_out) if with_bias else None
    x = torch.randn(rows, num_in)
    out = cpu_small_sgemm.linear(x, cpu_small_sgemm.pack(weight), num_out, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, num_out)
    assert_close_to_exact(out, x, weight, bias)


@requires_kernel
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it():
    """Bit for bit: a decode row gives the same logits alone, in a batch of any size, or at
    any place in it (a tile's first row or its last)."""
    torch.manual_seed(0)
    weight = torch.randn(300, 96)
    packed = cpu_small_sgemm.pack(weight)
    x = torch.randn(41, 96)
    together = cpu_small_sgemm.linear(x, packed, 300)
    for start, stop in [(0, 1), (5, 6), (3, 20), (7, 41), (0, 13)]:
        alone = cpu_small_sgemm.linear(x[start:stop].clone(), packed, 300)
        assert torch.equal(alone, together[start:stop])


@requires_kernel
def test_rows_in_different_blocks_give_the_same_bits():
    """A product of more rows than one block of x holds (K = 1536: 42 rows in AVX2 builds,
    36 in AVX-512 ones) runs block after block; a row's outputs are still its own."""
    torch.manual_seed(1)
    weight = torch.randn(96, 1536) / 1536**0.5
    packed = cpu_small_sgemm.pack(weight)
    x = torch.randn(131, 1536)
    together = cpu_small_sgemm.linear(x, packed, 96)
    assert_close_to_exact(together, x, weight, None)
    for start, stop in [(0, 1), (35, 37), (41, 43), (40, 90), (130, 131)]:
        alone = cpu_small_sgemm.linear(x[start:stop].clone(), packed, 96)
        assert torch.equal(alone, together[start:stop])


def _build_for(capability: str, monkeypatch) -> ctypes.CDLL:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    library, _ = cpu_build.load_library(cpu_small_sgemm.SOURCE)
    return library


def _product(library: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    library.small_sgemm_packed_numel.restype = ctypes.c_int64
    num_out, num_in = weight.shape
    n = library.small_sgemm_packed_numel(ctypes.c_int64(num_out), ctypes.c_int64(num_in))
    packed = torch.empty(n)
    i64 = ctypes.c_int64
    library.small_sgemm_pack(
        ctypes.c_void_p(weight.data_ptr()), i64(num_out), i64(num_in),
        ctypes.c_void_p(packed.data_ptr()),
    )  # fmt: skip
    out = torch.empty(x.shape[0], num_out)
    library.small_sgemm(
        ctypes.c_void_p(x.data_ptr()), i64(x.shape[0]), i64(num_in), i64(num_in),
        ctypes.c_void_p(packed.data_ptr()), i64(num_out), None,
        ctypes.c_void_p(out.data_ptr()), i64(num_out),
    )  # fmt: skip
    return out


@pytest.mark.skipif(
    str(torch.backends.cpu.get_cpu_capability()) != "AVX512",
    reason="needs a CPU (and torch) at AVX-512 to run both builds",
)
def test_avx2_and_avx512_builds_give_the_same_bits(monkeypatch):
    """The vector width changes the tiles, not the order of any output's sum: a server on an
    AVX2 box and one on an AVX-512 box give the same numbers."""
    torch.manual_seed(0)
    weight, x = torch.randn(200, 77), torch.randn(29, 77)
    avx2 = _product(_build_for("AVX2", monkeypatch), x, weight)
    avx512 = _product(_build_for("AVX512", monkeypatch), x, weight)
    assert torch.equal(avx2, avx512)


@requires_kernel
def test_strided_and_batched_inputs():
    weight = torch.randn(40, 24)
    x = torch.randn(2, 3, 48)[..., ::2]  # [2, 3, 24], every other column
    out = cpu_small_sgemm.linear(x, cpu_small_sgemm.pack(weight), 40)
    assert out.shape == (2, 3, 40)
    assert_close_to_exact(out.reshape(6, 40), x.reshape(6, 24), weight, None)


@requires_kernel
def test_no_rows_give_an_empty_product():
    """A step can sample no row (every sequence still in its prefill): nothing to multiply."""
    out = cpu_small_sgemm.linear(torch.empty(0, 24), cpu_small_sgemm.pack(torch.randn(40, 24)), 40)
    assert out.shape == (0, 40)


@requires_kernel
def test_bad_inputs_are_refused():
    packed = cpu_small_sgemm.pack(torch.randn(8, 16))
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_sgemm.linear(torch.randn(2, 16).bfloat16(), packed, 8)  # bf16 rows
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_sgemm.linear(torch.randn(2, 18), packed, 8)  # wrong K
    with pytest.raises(ValueError, match="expected a 2-D float32"):
        cpu_small_sgemm.pack(torch.randn(8, 16).bfloat16())


@requires_kernel
def test_the_python_packed_size_is_the_librarys():
    library = cpu_small_sgemm.load()
    for num_out, num_in in [(1, 1), (32, 64), (37, 77), (49152, 576), (33, 1)]:
        assert cpu_small_sgemm.packed_numel(num_out, num_in) == (
            library.small_sgemm_packed_numel(num_out, num_in)
        )


def _count_kernel_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = cpu_small_sgemm.linear

    def counted(x, *args, **kwargs):
        calls.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(cpu_small_sgemm, "linear", counted)
    return calls


@requires_kernel
def test_layers_use_it_for_every_row_count_outside_intel_cpus(monkeypatch):
    """MKL runs a generic path on other vendors' CPUs: no MKL copy is made."""
    monkeypatch.setattr(cpu_prepack, "cpu_is_intel", lambda: False)
    weight, bias = torch.randn(64, 40), torch.randn(64)
    packing = cpu_prepack.pack_weight(weight)
    assert isinstance(packing, cpu_prepack.Fp32Packing)
    assert packing.kernel is not None and packing.mkl is None
    calls = _count_kernel_calls(monkeypatch)
    for rows in (1, 7, 300):
        x = torch.randn(rows, 40)
        assert_close_to_exact(cpu_prepack.linear(x, weight, bias, packing), x, weight, bias)
    assert calls == [1, 7, 300]


@requires_kernel
@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL")
def test_intel_cpus_keep_mkl(monkeypatch):
    """MKL runs its own best code there; the kernel was measured no faster on a Xeon."""
    monkeypatch.setattr(cpu_prepack, "cpu_is_intel", lambda: True)
    weight, bias = torch.randn(64, 40), torch.randn(64)
    packing = cpu_prepack.pack_weight(weight)
    assert packing.kernel is None and packing.mkl is not None
    calls = _count_kernel_calls(monkeypatch)
    for rows in (1, 5, 300):
        x = torch.randn(rows, 40)
        out = cpu_prepack.linear(x, weight, bias, packing)
        torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert calls == []


def test_turned_off_by_the_environment_layers_keep_mkl(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_SGEMM_KERNEL", "0")
    assert cpu_small_sgemm.load() is None
    assert not cpu_small_sgemm.available()
    weight = torch.randn(16, 8)
    if cpu_prepack.can_prepack(weight):  # MKL
        packing = cpu_prepack.pack_weight(weight)
        assert packing.kernel is None and packing.mkl is not None
        x = torch.randn(3, 8)
        torch.testing.assert_close(
            cpu_prepack.linear(x, weight, None, packing), F.linear(x, weight)
        )


def test_below_avx2_there_is_no_kernel(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert cpu_small_sgemm.load() is None
    with pytest.raises(cpu_build.KernelBuildError, match="not available"):
        cpu_small_sgemm.pack(torch.randn(4, 4))
