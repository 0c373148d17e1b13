"""CPU linears: packed bf16 and weight-major fp32 give F.linear's numbers, on every layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from services.gpu_worker.layers.cpu_prepack import (
    can_prepack,
    is_weight_major,
    linear,
    pack_weight,
)
from services.gpu_worker.model_loader import load_model

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


def test_fp32_and_non_2d_weights_are_not_packed():
    assert not can_prepack(torch.zeros(4, 4))
    assert not can_prepack(torch.zeros(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("num_rows", [1, 64, 100])
def test_one_row_and_many_rows_are_f_linear(num_rows):
    weight, x = torch.randn(8, 4), torch.randn(num_rows, 4)
    assert not is_weight_major(x, weight)
    assert torch.equal(linear(x, weight), F.linear(x, weight))


@pytest.mark.parametrize("num_rows", [2, 3, 16, 32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_few_fp32_rows_are_the_same_product_weight_major(num_rows, with_bias):
    torch.manual_seed(0)
    weight = torch.randn(300, 96)
    bias = torch.randn(300) if with_bias else None
    x = torch.randn(num_rows, 192)[:, ::2]  # a strided input, as after a split
    assert is_weight_major(x, weight)
    out = linear(x, weight, bias)
    assert out.shape == (num_rows, 300) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_bf16_rows_are_never_weight_major():
    weight, x = torch.randn(8, 4).bfloat16(), torch.randn(4, 4).bfloat16()
    assert not is_weight_major(x, weight)


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
    assert all(m.packed_weight is not None for m in packed)
    hidden = torch.randn(5, model.config.hidden_size).bfloat16()
    unpacked_logits = F.linear(hidden, model.lm_head.weight).float()
    assert torch.equal(model.compute_logits(hidden), unpacked_logits)


def test_fp32_model_keeps_plain_weights(tiny_llama_dir):
    model = _load(tiny_llama_dir, torch.float32)
    assert all(getattr(m, "packed_weight", None) is None for m in model.modules())
