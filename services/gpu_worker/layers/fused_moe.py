"""A mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE):

    weights, ids = select_experts(x Wr^T)              (layers/moe_routing.py)
    out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])  (+ sigmoid(x wg) * shared(x))

Each expert is a gated MLP; their weights are stacked, `w13` [E, 2I, H] (gate then up) and
`w2` [E, H, I], from the checkpoint's per-expert tensors as they are named (`experts.3.w1`,
`experts.3.gate_proj`: see `EXPERT_CHECKPOINT_NAME`). Experts are computed grouped: the
(token, expert) pairs sorted by expert, one product per expert over its rows, never a loop
over tokens. Under tensor parallelism each rank holds every expert's slice of the
intermediate features (as `GatedMLP` does) and the partial sums meet in one all-reduce.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.services.gpu_worker.layers.activation import activation_and_mul
from pagedserve.services.gpu_worker.layers.custom_op import CustomOp
from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR, BaseLinearMethod
from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts
from pagedserve.services.gpu_worker.parallel_state import (
    all_reduce,
    divide,
    get_tp_rank,
    get_tp_world_size,
)

# `<prefix>.experts.<id>.<projection>.weight`: Mixtral's w1/w3/w2, the Qwen MoEs' names
EXPERT_CHECKPOINT_NAME = re.compile(
    r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\."
    r"(?P<projection>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
# checkpoint projection -> (our stacked parameter, its part)
EXPERT_PARTS = {
    "w1": ("w13_weight", "gate"),
    "gate_proj": ("w13_weight", "gate"),
    "w3": ("w13_weight", "up"),
    "up_proj": ("w13_weight", "up"),
    "w2": ("w2_weight", "down"),
    "down_proj": ("w2_weight", "down"),
}
PARTS_OF = {"w13_weight": ("gate", "up"), "w2_weight": ("down",)}


def grouped_experts(
    x: torch.Tensor,  # [T, H]
    experts: StackedExperts,
    weights: torch.Tensor,  # [T, k]
    ids: torch.Tensor,  # [T, k]
    act_and_mul: nn.Module,  # [n, 2I] -> [n, I]
) -> torch.Tensor:  # [T, H]
    """sum_j weights[t, j] * down(act(gate(x[t])) * up(x[t])) of expert ids[t, j]: the
    token rows sorted by expert, one pair of products per expert that any token chose."""
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = flat_ids.argsort(stable=True)  # (token, choice) pairs grouped by expert
    rows = x[order // top_k]  # [T*k, H]
    outputs = torch.empty_like(rows)
    counts = torch.bincount(flat_ids, minlength=experts.num_experts).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count:
            end = start + count
            hidden = act_and_mul(experts.product("w13_weight", expert, rows[start:end]))
            outputs[start:end] = experts.product("w2_weight", expert, hidden)
            start = end
    outputs.mul_(weights.reshape(-1)[order].unsqueeze(1).to(outputs.dtype))
    # back to (token, choice) order and summed over the choices: a scatter-add (index_add_)
    # of the sorted rows takes a slow serial path on the CPU
    by_choice = torch.empty_like(outputs)
    by_choice[order] = outputs
    return by_choice.view(-1, top_k, x.shape[1]).sum(dim=1)


class ExpertsOp(CustomOp):
    """The grouped expert products; every form is the torch one for now (a Triton fused-MoE
    kernel would be `forward_cuda`). Each product goes through the expert's linear method,
    which the CPU platform swaps for its packed one at load."""

    def forward_native(self, *args: torch.Tensor | nn.Module) -> torch.Tensor:
        return grouped_experts(*args)  # x, experts, weights, ids, act_and_mul


class ReplicatedLinear(nn.Module):
    """y = x W^T with the whole W on every rank (the router, the shared expert's gate)."""

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class StackedExperts(nn.Module):
    """Every expert's gate/up (`w13_weight`) and down (`w2_weight`) projections, this rank's
    slice of their intermediate features, filled one checkpoint tensor at a time."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.tp_rank = get_tp_rank()
        self.num_experts = num_experts
        self.size = divide(intermediate_size, get_tp_world_size(), "moe intermediate features")
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.size))
        # (parameter name, expert) -> its linear method where a platform gave it one
        self.linear_methods: dict[tuple[str, int], BaseLinearMethod] = {}

    def product(self, name: str, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """rows W^T with expert `expert`'s `w13_weight` or `w2_weight`."""
        method = self.linear_methods.get((name, expert), PLAIN_LINEAR)
        return method.apply(rows, getattr(self, name)[expert])

    def load_expert(self, expert: int, part: str, loaded: torch.Tensor) -> None:
        """Copy this rank's slice of one expert's checkpoint projection into its place."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is out of range (the config has {self.num_experts})")
        hidden, full = self.w2_weight.shape[1], self.size * get_tp_world_size()
        sliced_dim = 1 if part == "down" else 0
        expected = (hidden, full) if part == "down" else (full, hidden)
        if tuple(loaded.shape) != expected:
            raise ValueError(
                f"expert {expert} {part}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"the model expects {expected}"
            )
        shard = loaded.narrow(sliced_dim, self.tp_rank * self.size, self.size)
        if part == "down":
            self.w2_weight.data[expert].copy_(shard)
        else:
            offset = 0 if part == "gate" else self.size
            self.w13_weight.data[expert].narrow(0, offset, self.size).copy_(shard)


class FusedMoE(nn.Module):
    """The MoE MLP of a decoder layer, named as the checkpoints name it: `gate` (the router),
    `experts`, and Qwen2-MoE's `shared_expert` with its `shared_expert_gate` (DeepSeek's
    shared experts have no gate), and DeepSeek-V3's `e_score_correction_bias`."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,  # of each routed expert
        num_experts: int,
        routing: Routing,
        hidden_act: str = "silu",
        shared_expert: nn.Module | None = None,  # [T, H] -> [T, H], reduced over ranks
        shared_expert_gated: bool = True,  # Qwen2-MoE's sigmoid gate; DeepSeek adds it plain
        correction_bias: bool = False,  # DeepSeek-V3's e_score_correction_bias [E]
    ) -> None:
        super().__init__()
        routing.check(num_experts)
        self.routing = routing
        self.gate = ReplicatedLinear(hidden_size, num_experts)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size)
        self.act_and_mul = activation_and_mul(hidden_act)
        self.compute_experts = ExpertsOp()
        self.shared_expert = shared_expert
        gated = shared_expert is not None and shared_expert_gated
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1) if gated else None
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(num_experts, dtype=torch.float32)) if correction_bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        weights, ids = select_experts(self.gate(x), self.routing, self.e_score_correction_bias)
        out = self.compute_experts(x, self.experts, weights, ids, self.act_and_mul)
        out = all_reduce(out)  # the one all-reduce of the routed experts
        if self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        elif self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return out
