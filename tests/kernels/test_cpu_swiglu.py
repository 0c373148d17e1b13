"""The fused SwiGLU of the bf16 GEMM kernel (`small_gemm_swiglu`): silu(gate) * up of a merged
gate-and-up weight in one pass, against the same product followed by torch's ops, and the MLP
layer's choice between the two."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_small_gemm
from pagedserve.services.gpu_worker.layers import linear as linear_layers
from pagedserve.services.gpu_worker.layers.activation import SiluAndMul

pytestmark = pytest.mark.skipif(
    not cpu_small_gemm.cpu_has_avx512_bf16(),
    reason="the kernel is built only for CPUs with AVX512-BF16",
)


@pytest.fixture(autouse=True)
def vdpbf16ps_tiles(monkeypatch):
    """The fused pass uses the vdpbf16ps tiles (where the CPU has AMX, the products take the
    AMX tiles and silu_and_mul follows them instead)."""
    monkeypatch.setenv("PAGEDSERVE_CPU_GEMM_AMX", "0")
    cpu_small_gemm.load.cache_clear()
    cpu_small_gemm.amx_available.cache_clear()
    yield
    cpu_small_gemm.load.cache_clear()
    cpu_small_gemm.amx_available.cache_clear()


def unfused(x: torch.Tensor, packed: torch.Tensor, num_inter: int) -> torch.Tensor:
    gate, up = cpu_small_gemm.linear(x, packed, 2 * num_inter).chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("rows", [1, 5, 12, 13, 64, 300])
@pytest.mark.parametrize(("num_inter", "num_in"), [(1536, 576), (64, 33), (96, 128)])
def test_rounds_as_the_product_then_torchs_silu_and_mul(rows, num_inter, num_in):
    """Every tile height, odd K, activations up to +-100: the same bf16 values as the three
    ops."""
    torch.manual_seed(rows + num_in)
    weight = (torch.randn(2 * num_inter, num_in) * 4 / num_in**0.5).bfloat16()
    x = torch.randn(rows, num_in).bfloat16() * 8
    packed = cpu_small_gemm.pack(weight)
    out = cpu_small_gemm.swiglu(x, packed, num_inter)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, num_inter)
    expected = unfused(x, packed, num_inter)
    # silu's exp is not torch's: a value a hair from a bf16 boundary may round the other way
    assert (out != expected).float().mean() < 1e-3
    assert ((out.float() - expected.float()).abs() <= expected.float().abs() * 2**-7).all()


def test_silus_far_tails_as_torch():
    """Gate and up equal to chosen values (identity weights): where exp(x) is no longer a
    normal float (x < -87), where torch's exp(-x) overflows (x < -88.72) and large x."""
    values = [-200.0, -100.0, -89.0, -88.75, -88.5, -88.0, -87.5, -87.0, -86.5, -50.0, -20.0]
    values += [-1.0, -(2.0**-20), 0.0, 2.0**-20, 0.5, 1.0, 10.0, 88.0, 100.0, 3.0e38]
    values += [-float(i) for i in range(64 - len(values))]
    x = torch.tensor([values], dtype=torch.bfloat16)
    identity = torch.eye(64, dtype=torch.bfloat16)
    packed = cpu_small_gemm.pack(torch.cat([identity, identity]))
    out = cpu_small_gemm.swiglu(x, packed, 64)
    expected = F.silu(x) * x
    assert torch.equal(out, expected), (out - expected).abs().max()
    assert torch.equal(out.signbit(), expected.signbit())  # -0 where torch's is -0


@pytest.mark.parametrize("rows", [1, 12, 13, 64, 300])
@pytest.mark.parametrize(("num_inter", "num_in"), [(1536, 576), (64, 33)])
def test_silu_and_mul_after_the_product_gives_the_fused_passs_bits(rows, num_inter, num_in):
    """The AMX form (the product, then silu_and_mul) rounds as the fused pass: the product's
    bf16 outputs are the values the fused pass rounds gate and up to."""
    torch.manual_seed(rows + num_in)
    weight = (torch.randn(2 * num_inter, num_in) * 4 / num_in**0.5).bfloat16()
    x = torch.randn(rows, num_in).bfloat16() * 8
    packed = cpu_small_gemm.pack(weight)
    gate_up = cpu_small_gemm.linear(x, packed, 2 * num_inter)
    out = cpu_small_gemm.silu_and_mul(gate_up)
    assert out.shape == (rows, num_inter)
    assert torch.equal(out, cpu_small_gemm.swiglu(x, packed, num_inter))
    gate, up = gate_up.chunk(2, dim=-1)
    assert (out != F.silu(gate) * up).float().mean() < 1e-3  # torch's exp differs in an ulp


def test_silu_and_mul_reads_strided_and_batched_rows():
    gate_up = torch.randn(2, 3, 256).bfloat16() * 4
    wide = torch.zeros(6, 300, dtype=torch.bfloat16)
    wide[:, :256] = gate_up.reshape(6, 256)
    out = cpu_small_gemm.silu_and_mul(gate_up)
    assert out.shape == (2, 3, 128)
    assert torch.equal(out.reshape(6, 128), cpu_small_gemm.silu_and_mul(wide[:, :256]))
    gate, up = gate_up.chunk(2, dim=-1)
    assert ((out.float() - (F.silu(gate) * up).float()).abs() <= 0.05).all()


def test_silu_and_mul_refuses_what_it_cannot_split():
    with pytest.raises(ValueError, match="two halves, each a multiple of 32"):
        cpu_small_gemm.silu_and_mul(torch.randn(2, 96).bfloat16())  # halves of 48
    with pytest.raises(ValueError, match="two halves"):
        cpu_small_gemm.silu_and_mul(torch.randn(2, 64))  # float32


def test_batched_rows_keep_their_leading_shape():
    weight = torch.randn(128, 64).bfloat16()
    x = torch.randn(2, 3, 64).bfloat16()
    out = cpu_small_gemm.swiglu(x, cpu_small_gemm.pack(weight), 64)
    assert out.shape == (2, 3, 64)
    assert torch.equal(
        out.reshape(6, 64), cpu_small_gemm.swiglu(x.reshape(6, 64), cpu_small_gemm.pack(weight), 64)
    )


def test_refuses_what_it_cannot_fuse():
    packed = cpu_small_gemm.pack(torch.randn(96, 16).bfloat16())
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_small_gemm.swiglu(torch.randn(2, 16).bfloat16(), packed, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_small_gemm.swiglu(torch.randn(2, 16), packed, 32)  # float32 rows
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_gemm.swiglu(torch.randn(2, 18).bfloat16(), packed, 32)  # wrong K


def merged_layer(num_inter: int, num_in: int) -> linear_layers.MergedColumnParallelLinear:
    from pagedserve.services.gpu_worker.platforms import cpu_prepack

    layer = linear_layers.MergedColumnParallelLinear(num_in, [num_inter, num_inter])
    layer.weight.data = (torch.randn(2 * num_inter, num_in) / num_in**0.5).bfloat16()
    layer.linear_method = cpu_prepack.CpuPackedLinear(cpu_prepack.pack_weight(layer.weight))
    return layer


def test_the_mlp_layer_fuses_up_to_the_kernels_rows_then_multiplies_and_silu_and_muls(
    monkeypatch,
):
    layer = merged_layer(64, 64)
    fused, after_product = [], []
    real, real_silu = cpu_small_gemm.swiglu, cpu_small_gemm.silu_and_mul
    monkeypatch.setattr(cpu_small_gemm, "swiglu", lambda *a: fused.append(1) or real(*a))
    monkeypatch.setattr(
        cpu_small_gemm, "silu_and_mul", lambda x: after_product.append(1) or real_silu(x)
    )
    most = cpu_small_gemm.max_rows(64)
    for rows in (1, most, most + 1):
        x = torch.randn(rows, 64).bfloat16()
        gate, up = layer(x).chunk(2, dim=-1)
        out = layer.act_and_mul(x, SiluAndMul())
        assert ((out.float() - (F.silu(gate) * up).float()).abs() <= 0.02).all()
    assert len(fused) == 2 and len(after_product) == 1  # past the kernel's rows: oneDNN's


def test_where_amx_takes_k_the_mlp_layer_multiplies_then_silu_and_mul(monkeypatch):
    """Simulated (the `vdpbf16ps` product stands in for the AMX tiles'): up to the kernel's
    rows the product and then silu_and_mul, the fused pass's bits; beyond, oneDNN's product
    and then silu_and_mul."""
    layer = merged_layer(64, 64)
    library = cpu_small_gemm.load()
    fused = {rows: layer.act_and_mul(torch.ones(rows, 64).bfloat16(), SiluAndMul())
             for rows in (1, 5)}  # fmt: skip
    monkeypatch.setattr(cpu_small_gemm, "uses_amx", lambda num_in: num_in % 32 == 0)
    monkeypatch.setattr(cpu_small_gemm, "product_for", lambda num_in: library.small_gemm)
    calls, real = [], cpu_small_gemm.silu_and_mul
    monkeypatch.setattr(cpu_small_gemm, "silu_and_mul", lambda x: calls.append(1) or real(x))
    for rows, expected in fused.items():
        assert torch.equal(layer.act_and_mul(torch.ones(rows, 64).bfloat16(), SiluAndMul()),
                           expected)  # fmt: skip
    assert len(calls) == 2
    monkeypatch.setattr(cpu_small_gemm, "max_rows", lambda num_in: 4)
    x = torch.randn(5, 64).bfloat16()
    product = layer(x)  # past the kernel's rows: oneDNN's product
    assert torch.equal(layer.act_and_mul(x, SiluAndMul()), real(product))
    assert len(calls) == 3


def test_the_mlp_layer_keeps_torchs_ops_without_the_packing_or_with_a_width_off_the_panels():
    calls = []
    real = cpu_small_gemm.swiglu
    for layer in (merged_layer(48, 64), linear_layers.MergedColumnParallelLinear(64, [32, 32])):
        layer.weight.data = layer.weight.data.bfloat16().normal_()
        x = torch.randn(3, 64).bfloat16()
        cpu_small_gemm.swiglu = lambda *a: calls.append(1) or real(*a)
        try:
            gate, up = layer(x).chunk(2, dim=-1)
            assert torch.equal(layer.act_and_mul(x, SiluAndMul()), F.silu(gate) * up)
        finally:
            cpu_small_gemm.swiglu = real
    assert calls == []
