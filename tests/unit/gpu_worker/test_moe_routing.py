"""Expert selection for every routing family, against a token-at-a-time reference written
from the papers' description (no tensors shared with the implementation's grouping)."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts

NUM_EXPERTS = 16


def reference_token(logits: list[float], routing: Routing, bias: list[float]) -> dict[int, float]:
    """{expert: weight} for one token, by plain Python loops."""
    if routing.scoring == "softmax":
        peak = max(logits)
        exps = [math.exp(v - peak) for v in logits]
        scores = [e / sum(exps) for e in exps]
    else:
        scores = [1 / (1 + math.exp(-v)) for v in logits]
    choice = [s + b for s, b in zip(scores, bias, strict=True)]
    per_group = len(logits) // routing.num_groups
    groups = [choice[g * per_group : (g + 1) * per_group] for g in range(routing.num_groups)]
    if routing.group_score == "max":
        group_scores = [max(g) for g in groups]
    else:
        group_scores = [sum(sorted(g)[-2:]) for g in groups]
    kept = sorted(range(len(groups)), key=lambda g: -group_scores[g])[: routing.top_groups]
    candidates = [e for e in range(len(logits)) if e // per_group in kept]
    chosen = sorted(candidates, key=lambda e: -choice[e])[: routing.top_k]
    weights = {e: scores[e] for e in chosen}
    total = sum(weights.values()) if routing.renormalize else 1.0
    return {e: w / total * routing.scaling_factor for e, w in weights.items()}


FAMILIES = {
    "mixtral / qwen3-moe / gpt-oss": Routing(2, renormalize=True),
    "qwen2-moe": Routing(4),
    "deepseek-v2 group-limited greedy": Routing(
        3, num_groups=4, top_groups=2, group_score="max", scaling_factor=16.0
    ),
    "deepseek-v3 noaux_tc": Routing(
        4,
        scoring="sigmoid",
        renormalize=True,
        num_groups=4,
        top_groups=2,
        group_score="top2_sum",
        scaling_factor=2.5,
    ),
}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_family_picks_the_reference_experts_and_weights(name, with_bias):
    routing = FAMILIES[name]
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(23, NUM_EXPERTS, generator=generator) * 2
    bias = torch.randn(NUM_EXPERTS, generator=generator) if with_bias else None
    weights, ids = select_experts(logits, routing, bias)
    assert ids.shape == weights.shape == (23, routing.top_k)
    for t in range(23):
        expected = reference_token(
            logits[t].tolist(), routing, bias.tolist() if with_bias else [0.0] * NUM_EXPERTS
        )
        got = dict(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        assert got.keys() == expected.keys(), f"token {t}"
        for expert, weight in expected.items():
            assert got[expert] == pytest.approx(weight, rel=1e-5, abs=1e-6)


def test_groups_limit_the_choice():
    """A token whose best experts all sit in one group still picks from two groups only
    when top_groups=2, and from that group alone when top_groups=1."""
    logits = torch.full((1, 8), -5.0)
    logits[0, :4] = torch.tensor([4.0, 3.0, 2.0, 1.0])  # group 0 of 2
    logits[0, 6] = 0.5  # group 1's best
    one_group = select_experts(logits, Routing(3, num_groups=2, top_groups=1))[1]
    assert set(one_group[0].tolist()) == {0, 1, 2}
    ungrouped = select_experts(logits, Routing(3))[1]
    assert set(ungrouped[0].tolist()) == {0, 1, 2}
    steered = torch.zeros(8)
    steered[6] = 10.0  # the bias steers group 1 to the top; weights stay unbiased
    weights, ids = select_experts(logits, Routing(1, num_groups=2, top_groups=1), steered)
    assert ids.tolist() == [[6]]
    assert weights[0, 0] == pytest.approx(torch.softmax(logits[0], -1)[6].item())


@pytest.mark.parametrize(
    ("routing", "num_experts", "message"),
    [
        (Routing(5), 4, r"num_experts_per_tok must be in 1\.\.4"),
        (Routing(2, num_groups=3, top_groups=1), 8, "n_group=3 does not divide 8 experts"),
        (Routing(5, num_groups=4, top_groups=2), 8, "exceeds the 4 experts of topk_group=2"),
    ],
)
def test_impossible_routings_are_refused_naming_the_field(routing, num_experts, message):
    with pytest.raises(ValueError, match=message):
        routing.check(num_experts)


def test_bad_routing_fields_are_refused_at_construction():
    with pytest.raises(ValueError, match="num_experts_per_tok must be at least 1"):
        Routing(0)
    with pytest.raises(ValueError, match=r"topk_group must be in 1\.\.n_group=2"):
        Routing(1, num_groups=2, top_groups=3)
