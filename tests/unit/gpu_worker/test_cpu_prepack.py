"""CPU linears: packed bf16 and packed fp32 (the float32 kernel, and MKL) give F.linear's
numbers, on every layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_small_sgemm
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR
from pagedserve.services.gpu_worker.model_loader import load_model
from pagedserve.services.gpu_worker.platforms import cpu_prepack
from pagedserve.services.gpu_worker.platforms.cpu_prepack import (
    can_prepack,
    linear,
    pack_weight,
    packing_of,
    prepack_linears,
)

requires_bf16_kernels = pytest.mark.skipif(
    not can_prepack(torch.zeros(1, 1, dtype=torch.bfloat16)),
    reason="this CPU's oneDNN has no bf16 kernels: layers keep F.linear (tested below)",
)


@requires_bf16_kernels
@pytest.mark.parametrize("num_rows", [1, 3, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_is_bit_identical_to_f_linear(num_rows, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 40).bfloat16()
    bias = torch.randn(96).bfloat16() if with_bias else None
    x = torch.randn(num_rows, 80).bfloat16()[:, ::2]  # a strided input, as after a split
    expected = F.linear(x, weight, bias)
    assert torch.equal(linear(x, weight, bias, pack_weight(weight)), expected)


requires_mkl = pytest.mark.skipif(
    not torch.backends.mkl.is_available(), reason="this torch has no MKL"
)


@pytest.fixture(params=["kernel", pytest.param("mkl", marks=requires_mkl)])
def fp32_path(request, monkeypatch):
    """Each fp32 packing: the float32 kernel's (where it builds), or MKL's alone (the kernel
    turned off, as where it cannot be built)."""
    if request.param == "mkl":
        monkeypatch.setenv("PAGEDSERVE_CPU_SGEMM_KERNEL", "0")
    cpu_small_sgemm.load.cache_clear()
    if request.param == "kernel":
        if not cpu_small_sgemm.available():
            pytest.skip("the float32 kernel does not build here")
        monkeypatch.setattr(cpu_prepack, "cpu_is_intel", lambda: False)
    yield request.param
    cpu_small_sgemm.load.cache_clear()


def test_other_dtypes_and_non_2d_weights_are_not_packed():
    assert not can_prepack(torch.zeros(4, dtype=torch.bfloat16))
    assert not can_prepack(torch.zeros(4))
    assert not can_prepack(torch.zeros(4, 4, dtype=torch.float16))
    assert not can_prepack(torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.parametrize("num_rows", [1, 2, 3, 16, 17, 63, 64, 65, 100, 512])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_fp32_linear_is_f_linear_at_every_row_count(fp32_path, num_rows, with_bias):
    """The weight is packed once (MKL's for MKL_PACK_ROWS rows) and serves every row count."""
    torch.manual_seed(0)
    weight = torch.randn(300, 96)
    bias = torch.randn(300) if with_bias else None
    x = torch.randn(num_rows, 192)[:, ::2]  # a strided input, as after a split
    out = linear(x, weight, bias, pack_weight(weight))
    assert out.shape == (num_rows, 300) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@requires_mkl
def test_one_fp32_row_is_f_linears_gemv_exactly_beside_mkl(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_SGEMM_KERNEL", "0")
    cpu_small_sgemm.load.cache_clear()
    torch.manual_seed(0)
    weight, x = torch.randn(300, 96), torch.randn(1, 96)
    assert torch.equal(linear(x, weight, None, pack_weight(weight)), F.linear(x, weight))


def test_packed_fp32_rows_do_not_depend_on_each_other(fp32_path):
    """A row's product is the same whichever rows share its batch (a decode batch grows and
    shrinks step to step)."""
    torch.manual_seed(0)
    weight = torch.randn(512, 128)
    packed = pack_weight(weight)
    x = torch.randn(40, 128)
    alone = linear(x[:8], weight, None, packed)
    torch.testing.assert_close(linear(x, weight, None, packed)[:8], alone, rtol=1e-5, atol=1e-5)


def test_unpacked_layers_are_f_linear():
    weight, x = torch.randn(8, 4), torch.randn(3, 4)
    assert torch.equal(linear(x, weight), F.linear(x, weight))


def test_packing_runs_on_the_given_threads_and_restores_the_count():
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 4))
            self.linear_method = PLAIN_LINEAR

        def __setattr__(self, name, value):
            if name == "linear_method" and value is not PLAIN_LINEAR:
                seen.append(torch.get_num_threads())
            super().__setattr__(name, value)

    before = torch.get_num_threads()
    model = torch.nn.Sequential(Probe(), Probe())
    assert prepack_linears(model, num_threads=before + 1) == 2
    assert seen == [before + 1, before + 1]
    assert torch.get_num_threads() == before


def _load(model_dir, dtype):
    return load_model(model_dir, TorchAttentionBackend, dtype, torch.device("cpu"), False)


@requires_bf16_kernels
def test_bf16_model_packs_every_linear_and_the_lm_head(tiny_llama_dir):
    model = _load(tiny_llama_dir, torch.bfloat16)
    layer = model.layers[0]
    packed = [
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
        model.lm_head,
    ]
    assert all(packing_of(m) is not None for m in packed)
    hidden = torch.randn(5, model.config.hidden_size).bfloat16()
    unpacked_logits = F.linear(hidden, model.lm_head.weight)  # in bf16, as the model gives
    assert torch.equal(model.compute_logits(hidden), unpacked_logits)


def test_fp32_model_packs_every_linear_and_the_lm_head(fp32_path, tiny_llama_dir):
    model = _load(tiny_llama_dir, torch.float32)
    slots = [m for m in model.modules() if hasattr(m, "linear_method")]
    assert slots and all(packing_of(m) is not None for m in slots)
    kernel = fp32_path == "kernel"
    assert all((packing_of(m).kernel is not None) == kernel for m in slots)
    hidden = torch.randn(5, model.config.hidden_size)
    expected = F.linear(hidden, model.lm_head.weight)
    torch.testing.assert_close(model.compute_logits(hidden), expected, rtol=1e-5, atol=1e-5)
