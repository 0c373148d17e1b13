"""The fused SwiGLU of the float32 GEMM kernel (`small_sgemm_swiglu`): silu(gate) * up of a
merged gate-and-up weight in one pass, against the kernel's own product followed by torch's ops,
and the MLP layer taking it for float32 weights in the kernel's panels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_small_sgemm
from pagedserve.services.gpu_worker.layers import linear as linear_layers
from pagedserve.services.gpu_worker.layers.activation import SiluAndMul
from pagedserve.services.gpu_worker.platforms import cpu_prepack

pytestmark = [
    pytest.mark.skipif(
        str(torch.backends.cpu.get_cpu_capability()) not in ("AVX2", "AVX512"),
        reason="the kernel is built for CPUs with AVX2",
    ),
    pytest.mark.usefixtures("fresh_sgemm_load"),  # tests/kernels/conftest.py
]

# silu's exp is Cephes here and SLEEF in torch: a value may differ in its last bits
RELATIVE = 2.0**-20


def unfused(x: torch.Tensor, packed: torch.Tensor, num_inter: int) -> torch.Tensor:
    gate, up = cpu_small_sgemm.linear(x, packed, 2 * num_inter).chunk(2, dim=-1)
    return F.silu(gate) * up


def assert_torchs_up_to_last_bits(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert ((out - expected).abs() <= expected.abs() * RELATIVE).all(), (out - expected).abs().max()


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 64, 131])
@pytest.mark.parametrize(("num_inter", "num_in"), [(1536, 576), (64, 33), (96, 1536)])
def test_is_the_product_then_torchs_silu_and_mul(rows, num_inter, num_in):
    """Every tile height (6 rows in AVX2 builds, 12 in AVX-512 ones), odd K, rows in several
    blocks (K = 1536), activations up to +-100."""
    torch.manual_seed(rows + num_in)
    weight = torch.randn(2 * num_inter, num_in) * 4 / num_in**0.5
    x = torch.randn(rows, num_in) * 8
    packed = cpu_small_sgemm.pack(weight)
    out = cpu_small_sgemm.swiglu(x, packed, num_inter)
    assert out.dtype == torch.float32 and out.shape == (rows, num_inter)
    expected = unfused(x, packed, num_inter)
    assert_torchs_up_to_last_bits(out, expected)
    assert (out == expected).float().mean() > 0.5  # most values are torch's bits


def test_silus_far_tails_as_torch():
    """Gate and up equal to chosen values (identity weights): where exp(x) is no longer a
    normal float (x < -87), where torch's exp(-x) overflows (x < -88.72), and large x."""
    values = [-200.0, -100.0, -89.0, -88.75, -88.7, -88.5, -88.0, -87.5, -87.0, -86.5, -50.0]
    values += [-20.0, -1.0, -(2.0**-20), 0.0, 2.0**-20, 0.5, 1.0, 10.0, 88.0, 100.0, 1.0e18]
    width = 64
    values += [-float(i) for i in range(width - len(values))]
    x = torch.tensor([values])
    identity = torch.eye(width)
    packed = cpu_small_sgemm.pack(torch.cat([identity, identity]))
    out = cpu_small_sgemm.swiglu(x, packed, width)
    expected = F.silu(x) * x
    assert_torchs_up_to_last_bits(out, expected)
    assert torch.equal(out == 0, expected == 0)  # 0 exactly where torch's silu gives -0


def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it():
    torch.manual_seed(2)
    weight = torch.randn(2 * 96, 1536) / 1536**0.5
    packed = cpu_small_sgemm.pack(weight)
    x = torch.randn(131, 1536)
    together = cpu_small_sgemm.swiglu(x, packed, 96)
    for start, stop in [(0, 1), (35, 37), (41, 43), (40, 90), (130, 131)]:
        alone = cpu_small_sgemm.swiglu(x[start:stop].clone(), packed, 96)
        assert torch.equal(alone, together[start:stop])


def test_reads_strided_and_batched_rows():
    torch.manual_seed(3)
    weight = torch.randn(2 * 64, 40)
    packed = cpu_small_sgemm.pack(weight)
    wide = torch.randn(2, 3, 50)
    x = wide[..., :40]  # rows 50 apart
    out = cpu_small_sgemm.swiglu(x, packed, 64)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out.reshape(6, 64), cpu_small_sgemm.swiglu(x.reshape(6, 40), packed, 64))


def test_refuses_what_it_cannot_fuse():
    columns = cpu_small_sgemm._panel_columns()
    packed = cpu_small_sgemm.pack(torch.randn(4 * columns, 16))
    with pytest.raises(ValueError, match=f"multiple of {columns}"):
        cpu_small_sgemm.swiglu(torch.randn(2, 16), packed, columns + 8)
    with pytest.raises(ValueError, match="float32 rows"):
        cpu_small_sgemm.swiglu(torch.randn(2, 16).bfloat16(), packed, 2 * columns)
    with pytest.raises(ValueError, match="does not fit"):
        cpu_small_sgemm.swiglu(torch.randn(2, 18), packed, 2 * columns)  # wrong K
    assert not cpu_small_sgemm.takes_swiglu(columns + 8)
    assert cpu_small_sgemm.takes_swiglu(2 * columns)


def merged_layer(num_inter: int, num_in: int) -> linear_layers.MergedColumnParallelLinear:
    layer = linear_layers.MergedColumnParallelLinear(num_in, [num_inter, num_inter])
    layer.weight.data = torch.randn(2 * num_inter, num_in) / num_in**0.5
    layer.linear_method = cpu_prepack.CpuPackedLinear(cpu_prepack.pack_weight(layer.weight))
    return layer


def test_the_mlp_layer_fuses_float32_weights_in_the_kernels_panels(monkeypatch):
    monkeypatch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: True)
    layer = merged_layer(64, 48)
    calls, real = [], cpu_small_sgemm.swiglu
    monkeypatch.setattr(cpu_small_sgemm, "swiglu", lambda *a: calls.append(1) or real(*a))
    for rows in (1, 7, 300):
        x = torch.randn(rows, 48)
        gate, up = layer(x).chunk(2, dim=-1)
        assert_torchs_up_to_last_bits(layer.act_and_mul(x, SiluAndMul()), F.silu(gate) * up)
    assert len(calls) == 3


def test_the_mlp_layer_keeps_torchs_ops_beside_mkl_and_off_the_panels(monkeypatch):
    """MKL's packing (Intel CPUs) and a width that is not whole panels: the product, then
    torch's silu and multiplication, bit for bit."""
    calls, real = [], cpu_small_sgemm.swiglu
    monkeypatch.setattr(cpu_small_sgemm, "swiglu", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: True)
    odd = merged_layer(cpu_small_sgemm._panel_columns() + 8, 48)
    x = torch.randn(5, 48)
    gate, up = odd(x).chunk(2, dim=-1)
    assert torch.equal(odd.act_and_mul(x, SiluAndMul()), F.silu(gate) * up)
    if torch.backends.mkl.is_available():
        monkeypatch.setattr(cpu_prepack, "fp32_uses_kernel", lambda: False)
        mkl = merged_layer(64, 48)
        gate, up = mkl(x).chunk(2, dim=-1)
        assert torch.equal(mkl.act_and_mul(x, SiluAndMul()), F.silu(gate) * up)
    assert not calls
