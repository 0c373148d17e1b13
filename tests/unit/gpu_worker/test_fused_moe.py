"""The grouped expert path of `FusedMoE` against the token-by-token reference."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.reference import moe_reference
from pagedserve.services.gpu_worker.layers.fused_moe import (
    FusedMoE,
    grouped_experts,
)
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts
from pagedserve.services.gpu_worker.platforms.cpu_prepack import can_prepack, prepack_linears

HIDDEN, INTERMEDIATE = 32, 48


def loaded_moe(num_experts: int, top_k: int, renormalize: bool, **kwargs) -> FusedMoE:
    """A FusedMoE filled as a checkpoint fills it: one tensor per expert projection."""
    torch.manual_seed(0)
    moe = FusedMoE(
        HIDDEN, INTERMEDIATE, num_experts, Routing(top_k, renormalize=renormalize), **kwargs
    )
    moe.gate.weight.data.normal_(0, 0.5)
    for expert in range(num_experts):
        moe.experts.load_expert(expert, "gate", torch.randn(INTERMEDIATE, HIDDEN) * 0.2)
        moe.experts.load_expert(expert, "up", torch.randn(INTERMEDIATE, HIDDEN) * 0.2)
        moe.experts.load_expert(expert, "down", torch.randn(HIDDEN, INTERMEDIATE) * 0.2)
    return moe


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("num_experts", "top_k", "num_tokens"), [(4, 2, 37), (8, 2, 3), (6, 3, 1)])
def test_grouped_experts_equal_the_per_token_reference(renormalize, num_experts, top_k, num_tokens):
    """(8 experts, 3 tokens): most experts are chosen by no token."""
    moe = loaded_moe(num_experts, top_k, renormalize)
    x = torch.randn(num_tokens, HIDDEN)
    expected = moe_reference(
        x, moe.gate.weight, moe.experts.w13_weight, moe.experts.w2_weight, top_k, renormalize
    )
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-5)


def test_renormalisation_changes_the_result():
    """Both variants are exercised: without it the top-k weights sum to less than 1."""
    logits = torch.randn(5, 4)
    plain, ids = select_experts(logits, Routing(2))
    scaled, same_ids = select_experts(logits, Routing(2, renormalize=True))
    assert torch.equal(ids, same_ids)
    assert (plain.sum(-1) < 1).all()
    torch.testing.assert_close(scaled.sum(-1), torch.ones(5))


def test_tokens_choosing_one_expert_all_land_in_its_group():
    x = torch.randn(6, HIDDEN)
    moe = FusedMoE(HIDDEN, INTERMEDIATE, 3, Routing(2, renormalize=True))
    w13 = moe.experts.w13_weight.data.normal_()
    w2 = moe.experts.w2_weight.data.normal_()
    ids = torch.tensor([[2, 0]] * 6)
    weights = torch.tensor([[0.75, 0.25]] * 6)
    out = grouped_experts(x, moe.experts, weights, ids, moe.act_and_mul)

    def expert(e):
        gate, up = (x @ w13[e].T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ w2[e].T

    torch.testing.assert_close(out, 0.75 * expert(2) + 0.25 * expert(0), rtol=1e-4, atol=1e-4)


def test_qwen2_moe_gated_shared_expert_is_added():
    shared = GatedMLP(HIDDEN, 64, "silu", reduce_results=False)
    for param in shared.parameters():
        param.data.normal_(0, 0.2)
    moe = loaded_moe(4, 2, False, shared_expert=shared)
    moe.shared_expert_gate.weight.data.normal_(0, 0.5)
    x = torch.randn(9, HIDDEN)
    routed = moe_reference(
        x, moe.gate.weight, moe.experts.w13_weight, moe.experts.w2_weight, 2, False
    )
    gate = torch.sigmoid(x @ moe.shared_expert_gate.weight.T)
    torch.testing.assert_close(moe(x), routed + gate * shared(x), rtol=1e-5, atol=1e-5)


def test_bad_expert_tensors_and_routing_are_refused_naming_the_problem():
    moe = FusedMoE(HIDDEN, INTERMEDIATE, 4, Routing(2, renormalize=True))
    with pytest.raises(ValueError, match="expert 4 is out of range"):
        moe.experts.load_expert(4, "gate", torch.zeros(INTERMEDIATE, HIDDEN))
    with pytest.raises(ValueError, match="expert 1 up: checkpoint tensor has shape"):
        moe.experts.load_expert(1, "up", torch.zeros(INTERMEDIATE - 1, HIDDEN))
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in 1\.\.4"):
        FusedMoE(HIDDEN, INTERMEDIATE, 4, Routing(5))


def test_experts_packed_by_the_cpu_platform_give_the_same_output():
    moe = loaded_moe(4, 2, True)
    x = torch.randn(21, HIDDEN)
    plain = moe(x)
    assert prepack_linears(moe) >= 2 * 4 or not can_prepack(moe.experts.w2_weight[0])
    torch.testing.assert_close(moe(x), plain, rtol=1e-5, atol=1e-5)
