"""ERNIE 4.5's load-time reorder of each head's query and key rows (`deinterleave_heads`):
the order it gives, and checkpoint tensors it cannot split into heads refused."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.models.ernie4_5 import deinterleave_heads


def test_each_heads_rows_go_evens_then_odds():
    weight = torch.arange(8.0).repeat_interleave(3).view(8, 3)  # two heads of 4, row i is i
    reordered = deinterleave_heads(weight, head_dim=4)
    assert reordered[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert deinterleave_heads(torch.arange(8.0), head_dim=4).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_the_reorder_makes_interleaved_rotation_a_rotate_half_one():
    """A query and a key rotated in interleaved pairs give the dot product of their reordered
    rows rotated the usual way (halves), at any angles."""
    gen = torch.Generator().manual_seed(0)
    dim = 8
    q, k = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
    theta_q, theta_k = (
        torch.rand(dim // 2, generator=gen) * 6,
        torch.rand(dim // 2, generator=gen) * 6,
    )

    def interleaved(x, theta):
        pairs = x.view(-1, 2)
        cos, sin = theta.cos(), theta.sin()
        return torch.stack([pairs[:, 0] * cos - pairs[:, 1] * sin,
                            pairs[:, 1] * cos + pairs[:, 0] * sin], dim=1).flatten()  # fmt: skip

    def halves(x, theta):
        first, second = x.chunk(2)
        cos, sin = theta.cos(), theta.sin()
        return torch.cat([first * cos - second * sin, second * cos + first * sin])

    expected = interleaved(q, theta_q) @ interleaved(k, theta_k)
    ours = halves(deinterleave_heads(q, dim), theta_q) @ halves(deinterleave_heads(k, dim), theta_k)
    assert torch.allclose(ours, expected, atol=1e-5)


@pytest.mark.parametrize(("rows", "head_dim"), [(10, 4), (9, 3)])
def test_rows_that_are_not_whole_heads_are_refused(rows, head_dim):
    with pytest.raises(ValueError, match=f"{rows} rows are not whole heads of {head_dim}"):
        deinterleave_heads(torch.zeros(rows, 2), head_dim)
