"""The C argmax kernel (kernels/cpu_argmax.c) against torch's `argmax(dim=-1)`: random rows,
ties, NaN, infinities and rows shorter than a vector, in float32 and bf16, in the build this
machine gets and in the one an AVX2-only CPU gets (8 lanes instead of 16)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_argmax


@pytest.fixture(autouse=True, params=["this machine", "AVX2"])
def build(request, monkeypatch):
    """Every test runs on this machine's build and on an AVX2 CPU's (`ATEN_CPU_CAPABILITY`
    caps the ISA the kernel is compiled for), whose vectors are half as wide."""
    if request.param == "AVX2":
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    cpu_argmax.load.cache_clear()
    yield request.param
    cpu_argmax.load.cache_clear()


def test_the_kernel_builds_here(build):
    assert cpu_argmax.load() is not None
    flags = cpu_argmax.cpu_build.compile_flags()
    if build == "AVX2":
        assert "-mavx2" in flags and not any(f.startswith("-mavx512") for f in flags)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 49152), (3, 1), (5, 15), (2, 16), (7, 17), (1, 1000)])
def test_random_rows_match_torch(dtype, shape):
    torch.manual_seed(shape[1])
    logits = (torch.randn(shape) * 5).to(dtype)
    assert torch.equal(cpu_argmax.argmax(logits), logits.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_take_the_first_index_as_torch_does(dtype):
    logits = torch.zeros(6, 100, dtype=dtype)
    logits[0, [90, 7, 40]] = 3.0  # across lanes and the tail
    logits[1, [16, 32]] = 1.0  # the same lane, two (AVX2: four) vectors apart
    logits[2, [5, 99]] = 2.0  # one in a vector, one in the tail
    logits[3] = -float("inf")  # all equal: index 0
    logits[4, 3], logits[4, 19] = -0.0, 0.0  # zeros everywhere, signed: equal
    logits[5, 97], logits[5, 98] = 4.0, 4.0  # both in the tail
    assert cpu_argmax.argmax(logits).tolist() == logits.argmax(dim=-1).tolist() == [
        7, 16, 5, 0, 0, 97,
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nan_and_infinity_follow_torch(dtype):
    logits = torch.randn(5, 70).to(dtype)
    logits[0, 33] = float("nan")  # NaN counts as the largest
    logits[1, [12, 50]] = float("nan")  # the first NaN
    logits[2, 69] = float("nan")  # in the tail
    logits[3, 20] = float("inf")
    logits[4, [10, 66]] = float("inf")
    assert cpu_argmax.argmax(logits).tolist() == logits.argmax(dim=-1).tolist() == [
        33, 12, 69, 20, 10,
    ]  # fmt: skip


def test_takes_only_contiguous_float32_or_bf16_matrices():
    assert cpu_argmax.supports(torch.zeros(2, 8))
    assert cpu_argmax.supports(torch.zeros(2, 8, dtype=torch.bfloat16))
    assert not cpu_argmax.supports(torch.zeros(2, 8, dtype=torch.float16))
    assert not cpu_argmax.supports(torch.zeros(8, 2).t())
    assert not cpu_argmax.supports(torch.zeros(8))
    assert cpu_argmax.argmax(torch.zeros(0, 8)).shape == (0,)
