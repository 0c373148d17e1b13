"""The C add + RMSNorm kernel (kernels/cpu_rms_norm.c) against Hugging Face Llama's RMSNorm
arithmetic in torch ops, and the layer that uses it."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_rms_norm
from pagedserve.services.gpu_worker.layers.norm import RMSNorm


@pytest.fixture(autouse=True)
def fresh_load():
    cpu_rms_norm.load.cache_clear()
    yield
    cpu_rms_norm.load.cache_clear()


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward, op for op."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def test_the_kernel_builds_here():
    assert cpu_rms_norm.load() is not None


@pytest.mark.parametrize("rows", [1, 12, 300])
@pytest.mark.parametrize("hidden", [576, 13])  # 13: a row that is not whole vectors
def test_float32_matches_hf_to_rounding(rows, hidden):
    torch.manual_seed(rows)
    x, residual = torch.randn(rows, hidden) * 3, torch.randn(rows, hidden)
    weight = torch.randn(hidden)
    normed, summed = cpu_rms_norm.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, x + residual)
    torch.testing.assert_close(
        normed, hf_rms_norm(x + residual, weight, 1e-5), rtol=2e-6, atol=2e-6
    )


def test_bfloat16_rounds_where_hf_rounds():
    """bf16: the add rounds to bf16, the product of the norm rounds before the weight's: all
    but a few elements equal HF's (a near-tie of the mean, summed in another order, flips)."""
    torch.manual_seed(0)
    x = (torch.randn(64, 576) * 3).bfloat16()
    residual = torch.randn(64, 576).bfloat16()
    weight = torch.randn(576).bfloat16()
    normed, summed = cpu_rms_norm.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(summed, x + residual)
    expected = hf_rms_norm(x + residual, weight, 1e-6)
    assert (normed != expected).float().mean() < 1e-3
    torch.testing.assert_close(normed, expected, rtol=8e-3, atol=1e-2)  # one bf16 step


def test_without_a_residual_the_input_is_the_new_residual():
    x, weight = torch.randn(3, 64), torch.randn(64)
    normed, summed = cpu_rms_norm.add_rms_norm(x, None, weight, 1e-6)
    assert summed is x
    torch.testing.assert_close(normed, hf_rms_norm(x, weight, 1e-6), rtol=2e-6, atol=2e-6)


def test_what_it_cannot_take_is_refused_or_left_to_torch():
    weight = torch.ones(8)
    assert not cpu_rms_norm.supports(torch.zeros(2, 8).half(), weight.half())
    assert not cpu_rms_norm.supports(torch.zeros(2, 8), weight.bfloat16())  # mixed dtypes
    assert not cpu_rms_norm.supports(torch.zeros(8, 2).t(), weight)  # not contiguous
    assert not cpu_rms_norm.supports(torch.zeros(2, 8), weight, torch.zeros(2, 16)[:, ::2])
    too_wide = cpu_rms_norm.MAX_HIDDEN + 8
    assert not cpu_rms_norm.supports(torch.zeros(1, too_wide), torch.ones(too_wide))
    with pytest.raises(ValueError, match="residual must be"):
        cpu_rms_norm.add_rms_norm(torch.zeros(2, 8), torch.zeros(3, 8), weight, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_layer_gives_the_torch_paths_numbers(dtype, monkeypatch):
    torch.manual_seed(1)
    norm = RMSNorm(96, 1e-5).to(dtype)
    norm.weight.data.normal_()
    x, residual = torch.randn(5, 96).to(dtype), torch.randn(5, 96).to(dtype)
    kernel_normed, kernel_sum = norm(x, residual)
    monkeypatch.setenv("PAGEDSERVE_CPU_NORM_KERNEL", "0")
    cpu_rms_norm.load.cache_clear()
    assert not cpu_rms_norm.supports(x, norm.weight)
    torch_normed, torch_sum = norm(x, residual)
    assert torch.equal(kernel_sum, torch_sum)
    torch.testing.assert_close(kernel_normed, torch_normed, rtol=8e-3, atol=1e-2)
    if dtype == torch.float32:
        torch.testing.assert_close(kernel_normed, torch_normed, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "heads"), [(1, 1), (5, 4), (300, 16)])  # serial, threads
def test_heads_in_strided_rows_get_the_contiguous_norms_bits(dtype, rows, heads):
    """The query heads of qkv rows normed in place (Qwen3's q norm in the fused forward):
    the bits of add_rms_norm on a contiguous copy of those heads, the rest of the rows as
    they were."""
    head_dim, width = 64, (heads + 2 * 2) * 64
    torch.manual_seed(rows)
    qkv = (torch.randn(rows, width) * 3).to(dtype)
    weight = torch.randn(head_dim).to(dtype)
    heads_before = qkv[:, : heads * head_dim].reshape(rows * heads, head_dim).clone()
    rest_before = qkv[:, heads * head_dim :].clone()
    out = cpu_rms_norm.rms_norm_heads_(qkv, heads, weight, 1e-6)
    assert out is qkv
    expected, _ = cpu_rms_norm.add_rms_norm(heads_before, None, weight, 1e-6)
    assert torch.equal(qkv[:, : heads * head_dim].reshape(rows * heads, head_dim), expected)
    assert torch.equal(qkv[:, heads * head_dim :], rest_before)


def test_heads_that_do_not_fit_the_rows_are_refused():
    x = torch.randn(3, 128)
    with pytest.raises(ValueError, match="heads of 64"):
        cpu_rms_norm.rms_norm_heads_(x, 3, torch.ones(64), 1e-6)  # 192 > 128 columns
    with pytest.raises(ValueError, match="weight's dtype"):
        cpu_rms_norm.rms_norm_heads_(x, 2, torch.ones(64).bfloat16(), 1e-6)


def test_heads_without_the_kernel_are_an_error_that_says_so(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_NORM_KERNEL", "0")
    with pytest.raises(RuntimeError, match="not available"):
        cpu_rms_norm.rms_norm_heads_(torch.randn(2, 64), 1, torch.ones(64), 1e-6)


def rms_norm_add(x, residual, out, weight, eps):
    """The kernel's post-norm form, called as the fused forward's layer loop calls it."""
    return cpu_rms_norm.load().rms_norm_add(
        x.data_ptr(), residual.data_ptr(), out.data_ptr(), weight.data_ptr(), x.shape[0],
        x.shape[1], eps, int(x.dtype == torch.bfloat16),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 300])  # serial, threads
def test_the_post_norm_add_is_the_modules_norm_then_add(dtype, rows):
    """residual + RMSNorm(x) (OLMo 2's `hidden + norm(branch)`): the bits of the norm without
    a residual, then a torch add, into a buffer of its own or in place of the residual."""
    torch.manual_seed(rows)
    x, residual = (torch.randn(rows, 576) * 3).to(dtype), torch.randn(rows, 576).to(dtype)
    weight = torch.randn(576).to(dtype)
    normed, _ = cpu_rms_norm.add_rms_norm(x, None, weight, 1e-6)
    expected = residual + normed
    out = torch.full_like(x, float("nan"))
    assert rms_norm_add(x, residual, out, weight, 1e-6) == 0
    assert torch.equal(out, expected)
    assert rms_norm_add(x, residual, residual, weight, 1e-6) == 0
    assert torch.equal(residual, expected)


def test_the_post_norm_add_refuses_a_row_past_its_buffer():
    too_wide = cpu_rms_norm.MAX_HIDDEN + 8
    x = torch.zeros(1, too_wide)
    assert rms_norm_add(x, x.clone(), x.clone(), torch.ones(too_wide), 1e-6) == -1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_projection_normed_as_one_head(dtype):
    """OLMo 2's q norm in the qkv rows: one "head" of 4096 (32 heads of 128)."""
    width, rows = 4096, 3
    torch.manual_seed(0)
    qkv = torch.randn(rows, width + 2 * 1024).to(dtype)
    weight = torch.randn(width).to(dtype)
    expected, _ = cpu_rms_norm.add_rms_norm(qkv[:, :width].clone(), None, weight, 1e-6)
    cpu_rms_norm.rms_norm_heads_(qkv, 1, weight, 1e-6)
    assert torch.equal(qkv[:, :width], expected)
