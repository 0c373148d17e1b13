"""The Triton fused-MoE kernel (under the interpreter, fp32: its bf16 dot is broken) against
the token-by-token `experts_reference`, for every routing `layers/moe_routing.py` builds: the
routing decides the ids and weights the kernel is given (sigmoid weights that do not sum to
1, scaled ones, experts a group limit or a correction bias left out), token counts below, at
and across the block size, top_k 1/2/4 and 4 or 8 experts."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.fused_moe import Tiles, choose_tiles, fused_experts
from pagedserve.kernels.reference import experts_reference
from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts

HIDDEN, INTERMEDIATE = 40, 24  # not multiples of the kernel's tiles


def routing_variants(top_k: int, num_experts: int) -> dict[str, tuple[Routing, bool]]:
    """name -> (routing, with a correction bias); groups of 2 experts so that the group
    limit leaves some out, as many groups kept as top_k needs."""
    groups = num_experts // 2
    kept = min(groups, max(1, -(-top_k // 2)) + (1 if groups > 2 else 0))
    deepseek = {"num_groups": groups, "top_groups": kept}
    return {
        "softmax": (Routing(top_k), False),
        "softmax renormalised": (Routing(top_k, renormalize=True), False),
        "sigmoid": (Routing(top_k, scoring="sigmoid"), False),
        "sigmoid renormalised scaled": (
            Routing(top_k, scoring="sigmoid", renormalize=True, scaling_factor=2.5),
            False,
        ),
        "group max scaled (DeepSeek-V2)": (
            Routing(top_k, group_score="max", scaling_factor=16.0, **deepseek),
            False,
        ),
        "group top2_sum bias (DeepSeek-V3)": (
            Routing(top_k, "sigmoid", True, group_score="top2_sum", scaling_factor=2.5, **deepseek),
            True,
        ),
        "softmax with bias": (Routing(top_k, renormalize=True), True),
    }


def random_experts(num_experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * INTERMEDIATE, HIDDEN, generator=gen) * 0.2
    w2 = torch.randn(num_experts, HIDDEN, INTERMEDIATE, generator=gen) * 0.2
    return w13, w2


def routed(num_tokens: int, num_experts: int, routing: Routing, with_bias: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, HIDDEN, generator=gen)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    bias = torch.randn(num_experts, generator=gen) * 0.5 if with_bias else None
    routing.check(num_experts)
    weights, ids = select_experts(logits, routing, bias)
    return x, weights, ids


CASES = [
    (num_tokens, top_k, num_experts)
    for num_experts in (4, 8)
    for top_k in (1, 2, 4)
    for num_tokens in (1, 7, 16, 37)
]


@pytest.mark.parametrize("variant", list(routing_variants(2, 8)))
@pytest.mark.parametrize(("num_tokens", "top_k", "num_experts"), CASES)
def test_kernel_matches_the_reference(variant, num_tokens, top_k, num_experts):
    routing, with_bias = routing_variants(top_k, num_experts)[variant]
    x, weights, ids = routed(num_tokens, num_experts, routing, with_bias, seed=num_tokens)
    w13, w2 = random_experts(num_experts, seed=top_k)
    out = fused_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(
        out, experts_reference(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5
    )


def test_the_variants_route_differently():
    """The variants are not one routing under several names: each picks other experts or
    other weights for the same logits."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 8, generator=gen)
    bias = torch.randn(8, generator=gen)
    picks = [
        select_experts(logits, routing, bias if with_bias else None)
        for routing, with_bias in routing_variants(2, 8).values()
    ]
    for i, (weights, ids) in enumerate(picks):
        for other_weights, other_ids in picks[i + 1 :]:
            same_ids = torch.equal(ids.sort(-1).values, other_ids.sort(-1).values)
            assert not (same_ids and torch.allclose(weights.sum(-1), other_weights.sum(-1)))


def test_a_block_spanning_many_tokens_of_one_expert():
    """A prefill in which one expert takes more rows than a block holds, the others none."""
    num_tokens = 70
    x = torch.randn(num_tokens, HIDDEN)
    w13, w2 = random_experts(8, seed=1)
    ids = torch.stack([torch.full((num_tokens,), 5), torch.arange(num_tokens) % 2], dim=1)
    weights = torch.rand(num_tokens, 2)
    assert choose_tiles(2 * num_tokens, 8, torch.float32).block_m < num_tokens
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids),
        experts_reference(x, w13, w2, weights, ids),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("tiles", [Tiles(16, 16, 16), Tiles(32, 64, 16, 8, 2)])
def test_other_tiles_give_the_same_result(tiles):
    """The tile sizes a sweep tries (benchmarks/moe_kernel.py --sweep) change no result."""
    x, weights, ids = routed(23, 8, Routing(2, renormalize=True), False, seed=5)
    w13, w2 = random_experts(8, seed=5)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids, tiles),
        experts_reference(x, w13, w2, weights, ids),
        rtol=1e-5,
        atol=1e-5,
    )


def test_strided_input_and_empty_step():
    w13, w2 = random_experts(4, seed=2)
    wide = torch.randn(9, 2 * HIDDEN)
    x = wide[:, :HIDDEN]  # rows of a wider tensor: stride 2H
    ids = torch.tensor([[0, 3]] * 9)
    weights = torch.full((9, 2), 0.5)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids),
        experts_reference(x.contiguous(), w13, w2, weights, ids),
        rtol=1e-5,
        atol=1e-5,
    )
    empty = fused_experts(x[:0], w13, w2, weights[:0], ids[:0])
    assert empty.shape == (0, HIDDEN)


def test_bad_shapes_are_refused_naming_them():
    w13, w2 = random_experts(4, seed=2)
    x = torch.randn(3, HIDDEN)
    ids = torch.zeros(3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"w2 must be \(4, 40, 24\)"):
        fused_experts(x, w13, w2[:, :, :-1], torch.ones(3, 2), ids)
    with pytest.raises(ValueError, match="ids and weights must both be"):
        fused_experts(x, w13, w2, torch.ones(3, 1), ids)
    with pytest.raises(ValueError, match=r"w13 dtype torch\.float16 must match"):
        fused_experts(x, w13.half(), w2, torch.ones(3, 2), ids)
