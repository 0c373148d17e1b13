"""The C rotary kernel (kernels/cpu_rotary.c) against the torch path it replaces."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_rotary
from pagedserve.services.gpu_worker.layers.rotary import ApplyRotary, RotaryEmbedding, rotate

rotate_in_place = ApplyRotary(form="cpu")  # the CPU form, as a model built on the CPU calls it


@pytest.fixture(autouse=True)
def fresh_load():
    cpu_rotary.load.cache_clear()
    yield
    cpu_rotary.load.cache_clear()


def test_the_kernel_builds_here():
    assert cpu_rotary.load() is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 600])
def test_bit_identical_to_the_torch_path_on_a_projection_view(dtype, tokens):
    """As the model calls it: q and k heads, a view into the fused qkv projection's rows."""
    torch.manual_seed(tokens)
    rope = RotaryEmbedding(64, 4096, 10000.0)
    qkv = (torch.randn(tokens, (9 + 3 + 3) * 64) * 4).to(dtype)
    qk = qkv[:, : 12 * 64].view(tokens, 12, 64)
    angles = rope.angles(torch.randint(0, 4096, (tokens,)))
    expected = rotate(qk, angles)
    v_before = qkv[:, 12 * 64 :].clone()
    assert cpu_rotary.supports(qk, *angles)
    out = rotate_in_place(qk, angles)
    assert out.data_ptr() == qkv.data_ptr()  # written in place
    assert torch.equal(out, expected)
    assert torch.equal(qkv[:, 12 * 64 :], v_before)  # the values are not touched


def test_what_it_cannot_take_goes_to_torch():
    rope = RotaryEmbedding(8, 16, 10000.0)
    angles = rope.angles(torch.arange(2))
    assert not cpu_rotary.supports(torch.zeros(2, 3, 8).half(), *angles)
    assert not cpu_rotary.supports(torch.zeros(2, 8, 3).transpose(1, 2), *angles)
    assert not cpu_rotary.supports(torch.zeros(3, 3, 8), *angles)  # angles for 2 tokens
    x = torch.randn(2, 3, 8).half()
    torch.testing.assert_close(rotate_in_place(x.clone(), angles), rotate(x, angles))


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_ROTARY_KERNEL", "0")
    assert cpu_rotary.load() is None
    rope = RotaryEmbedding(8, 16, 10000.0)
    angles = rope.angles(torch.arange(2))
    x = torch.randn(2, 3, 8)
    assert torch.equal(rotate_in_place(x.clone(), angles), rotate(x, angles))
