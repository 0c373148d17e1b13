"""How a mixture-of-experts layer picks each token's experts from its router logits:

    scores  = softmax(logits) or sigmoid(logits)                      (in float32)
    choice  = scores (+ a per-expert correction bias, DeepSeek-V3)
    choice  = choice with every expert outside the `top_groups` best groups masked out
    ids     = top_k(choice);  weights = scores[ids]  (renormalised to sum 1 where asked)
    weights = weights * scaling_factor

Every family is one `Routing`:
- Mixtral, Qwen3-MoE, GPT-OSS: softmax, renormalised (softmax over all experts then
  renormalised over the chosen ones is the softmax of the chosen logits, GPT-OSS's order);
- Qwen2-MoE: softmax, renormalised only where `norm_topk_prob`;
- DeepSeek-V2: softmax, group-limited greedy (a group scores its best expert), scaled;
- DeepSeek-V3: sigmoid plus the correction bias, groups scored by their two best experts,
  renormalised and scaled (`noaux_tc`).
The bias steers the choice only; the weights are the uncorrected scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Scoring = Literal["softmax", "sigmoid"]
GroupScore = Literal["max", "top2_sum"]


@dataclass(frozen=True)
class Routing:
    top_k: int
    scoring: Scoring = "softmax"
    renormalize: bool = False
    num_groups: int = 1  # DeepSeek's n_group: experts split evenly into groups
    top_groups: int = 1  # topk_group: a token's experts come from its best groups only
    group_score: GroupScore = "max"
    scaling_factor: float = 1.0  # routed_scaling_factor

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"num_experts_per_tok must be at least 1, got {self.top_k}")
        if not 1 <= self.top_groups <= self.num_groups:
            raise ValueError(
                f"topk_group must be in 1..n_group={self.num_groups}, got {self.top_groups}"
            )

    def check(self, num_experts: int) -> None:
        """Refuse, naming the config field, a routing these experts cannot take."""
        if self.top_k > num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..{num_experts}, got {self.top_k}")
        if num_experts % self.num_groups:
            raise ValueError(f"n_group={self.num_groups} does not divide {num_experts} experts")
        per_group = num_experts // self.num_groups
        if self.top_k > self.top_groups * per_group:
            raise ValueError(
                f"num_experts_per_tok={self.top_k} exceeds the {self.top_groups * per_group} "
                f"experts of topk_group={self.top_groups} groups"
            )


def select_experts(
    router_logits: torch.Tensor,  # [T, E]
    routing: Routing,
    correction_bias: torch.Tensor | None = None,  # [E], DeepSeek-V3's e_score_correction_bias
) -> tuple[torch.Tensor, torch.Tensor]:  # weights [T, k] in the logits' dtype, ids [T, k]
    """Each token's `top_k` experts and their weights (see the module's docstring)."""
    logits = router_logits.float()
    scores = logits.softmax(dim=-1) if routing.scoring == "softmax" else logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if routing.num_groups > 1:
        choice = _keep_top_groups(choice, routing)
    ids = choice.topk(routing.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if routing.scaling_factor != 1.0:
        weights = weights * routing.scaling_factor
    return weights.to(router_logits.dtype), ids


def _keep_top_groups(choice: torch.Tensor, routing: Routing) -> torch.Tensor:
    """`choice` with the experts outside each token's `top_groups` best groups at -inf."""
    grouped = choice.view(choice.shape[0], routing.num_groups, -1)  # [T, G, E/G]
    if routing.group_score == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = group_scores.topk(routing.top_groups, dim=-1).indices  # [T, top_groups]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view_as(choice)
