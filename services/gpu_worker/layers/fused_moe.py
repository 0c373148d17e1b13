"""A mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE):

    weights, ids = select_experts(x Wr^T)              (layers/moe_routing.py)
    out[t] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])  (+ sigmoid(x wg) * shared(x))

Each expert is a gated MLP; their weights are stacked, `w13` [E, 2I, H] (gate then up) and
`w2` [E, H, I], from the checkpoint's per-expert tensors as they are named (`experts.3.w1`,
`experts.3.gate_proj`: see `EXPERT_CHECKPOINT_NAME`). Experts are computed grouped: the
(token, expert) pairs sorted by expert, one product per expert over its rows, never a loop
over tokens. Under tensor parallelism each rank holds every expert's slice of the
intermediate features (as `GatedMLP` does), and the layer reduces once: the shared
expert's partial sum (a `GatedMLP(reduce_results=False)`, scaled by its replicated gate) is
added to the routed experts' before the one all-reduce.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.services.gpu_worker.layers.activation import SiluAndMul, activation_and_mul
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
    """The experts' products of a step: `forward_native` is the torch grouping above, each
    product through the expert's linear method (the CPU platform swaps in packed ones at
    load); `forward_cuda` is the Triton fused-MoE kernel (`kernels/fused_moe.py`) wherever
    it computes these experts (`kernel_computes`), the native grouping elsewhere."""

    def forward_native(
        self,
        x: torch.Tensor,
        experts: StackedExperts,
        weights: torch.Tensor,
        ids: torch.Tensor,
        act_and_mul: nn.Module,
    ) -> torch.Tensor:
        return grouped_experts(x, experts, weights, ids, act_and_mul)

    def forward_cuda(
        self,
        x: torch.Tensor,
        experts: StackedExperts,
        weights: torch.Tensor,
        ids: torch.Tensor,
        act_and_mul: nn.Module,
    ) -> torch.Tensor:
        if not kernel_computes(experts, act_and_mul):
            return self.forward_native(x, experts, weights, ids, act_and_mul)
        from pagedserve.kernels.fused_moe import fused_experts

        return fused_experts(x, experts.w13_weight, experts.w2_weight, weights, ids)

    def workspace_bytes(
        self, num_tokens: int, top_k: int, experts: StackedExperts, act_and_mul: nn.Module
    ) -> int:
        """Bytes the experts' products of a `num_tokens` step hold at their peak, on the path
        this op takes for these experts (the memory profile reserves them)."""
        hidden, intermediate = experts.w2_weight.shape[1], experts.size
        dtype = experts.w13_weight.dtype
        if self._impl == self.forward_cuda and kernel_computes(experts, act_and_mul):
            from pagedserve.kernels.fused_moe import workspace_bytes

            return workspace_bytes(
                num_tokens, top_k, hidden, intermediate, experts.num_experts, dtype
            )
        return native_workspace_bytes(num_tokens, top_k, hidden, intermediate, dtype)


def native_workspace_bytes(
    num_tokens: int, top_k: int, hidden: int, intermediate: int, dtype: torch.dtype
) -> int:
    """`grouped_experts` at its peak: the sorted rows, their outputs and the rows back in
    (token, choice) order [T*k, H] each, the sum [T, H], one expert's gate/up and activation
    (at most T rows: a token chooses an expert once) and the int64 sort of the pairs."""
    item = torch.empty((), dtype=dtype).element_size()
    rows = num_tokens * top_k
    return item * (3 * rows * hidden + num_tokens * (hidden + 3 * intermediate)) + 16 * rows


# the only parameters of experts the fused kernel multiplies: no biases, no other tensors
KERNEL_PARAMETERS = {"w13_weight", "w2_weight"}


def kernel_computes(experts: StackedExperts, act_and_mul: nn.Module) -> bool:
    """Whether the fused kernel computes these experts: SiLU-and-multiply (exactly: not a
    variant of it), only the stacked weights as parameters (expert biases, scales of a
    quantized format are not in the kernel) and no platform linear methods."""
    names = {name for name, _ in experts.named_parameters()}
    return (
        type(act_and_mul) is SiluAndMul
        and names == KERNEL_PARAMETERS
        and not experts.linear_methods
    )


class ReplicatedLinear(nn.Module):
    """y = x W^T (+ b) with the whole W on every rank (the router, the shared expert's gate)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class StackedExperts(nn.Module):
    """Every expert's gate/up (`w13_weight`) and down (`w2_weight`) projections, this rank's
    slice of their intermediate features, filled one checkpoint tensor at a time. With `bias`
    (GPT-OSS), each expert's products add its biases: `w13_bias` [E, 2I] (this rank's slice)
    and `w2_bias` [E, H], added on rank 0 only so that the all-reduce sums it once."""

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, bias: bool = False
    ) -> None:
        super().__init__()
        self.tp_rank = get_tp_rank()
        self.num_experts = num_experts
        self.size = divide(intermediate_size, get_tp_world_size(), "moe intermediate features")
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * self.size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, self.size))
        self.w13_bias = nn.Parameter(torch.empty(num_experts, 2 * self.size)) if bias else None
        self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden_size)) if bias else None
        # (parameter name, expert) -> its linear method where a platform gave it one
        self.linear_methods: dict[tuple[str, int], BaseLinearMethod] = {}

    def product(self, name: str, expert: int, rows: torch.Tensor) -> torch.Tensor:
        """rows W^T with expert `expert`'s `w13_weight` or `w2_weight`."""
        method = self.linear_methods.get((name, expert), PLAIN_LINEAR)
        return method.apply(rows, getattr(self, name)[expert], self._bias(name, expert))

    def _bias(self, name: str, expert: int) -> torch.Tensor | None:
        if self.w13_bias is None or (name == "w2_weight" and self.tp_rank != 0):
            return None
        return (self.w13_bias if name == "w13_weight" else self.w2_bias)[expert]

    def load_expert_bias(self, expert: int, part: str, loaded: torch.Tensor) -> None:
        """This rank's slice of one expert's gate, up or down bias (see `load_expert`)."""
        if self.w13_bias is None or self.w2_bias is None:
            raise ValueError(f"expert {expert} {part} bias: these experts have no biases")
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is out of range (the config has {self.num_experts})")
        full = self.w2_bias.shape[1] if part == "down" else self.size * get_tp_world_size()
        if tuple(loaded.shape) != (full,):
            raise ValueError(
                f"expert {expert} {part} bias: checkpoint tensor has shape "
                f"{tuple(loaded.shape)}, the model expects ({full},)"
            )
        if part == "down":
            self.w2_bias.data[expert].copy_(loaded)
            return
        offset = 0 if part == "gate" else self.size
        shard = loaded.narrow(0, self.tp_rank * self.size, self.size)
        self.w13_bias.data[expert].narrow(0, offset, self.size).copy_(shard)

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
    shared experts have no gate). GPT-OSS adds a router bias (`router_bias`), expert biases
    (`expert_bias`) and its own activation (`act_and_mul`, which replaces `hidden_act`'s);
    DeepSeek-V3 its `e_score_correction_bias` (`correction_bias`)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,  # of each routed expert
        num_experts: int,
        routing: Routing,
        hidden_act: str = "silu",
        shared_expert: nn.Module | None = None,  # [T, H] -> [T, H], this rank's partial sum
        *,
        router_bias: bool = False,
        expert_bias: bool = False,
        act_and_mul: nn.Module | None = None,  # [n, 2I] -> [n, I]; None: hidden_act's
        shared_expert_gated: bool = True,  # Qwen2-MoE's sigmoid gate; DeepSeek adds it plain
        correction_bias: bool = False,  # DeepSeek-V3's e_score_correction_bias [E]
    ) -> None:
        super().__init__()
        routing.check(num_experts)
        if shared_expert is not None and getattr(shared_expert, "reduce_results", True):
            raise ValueError(
                "the shared expert must return its partial sum (reduce_results=False): "
                "FusedMoE reduces it with the routed experts' in one all-reduce"
            )
        self.routing = routing
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=router_bias)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size, expert_bias)
        self.act_and_mul = act_and_mul or activation_and_mul(hidden_act)
        self.compute_experts = ExpertsOp()
        self.shared_expert = shared_expert
        gated = shared_expert is not None and shared_expert_gated
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1) if gated else None
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(num_experts, dtype=torch.float32)) if correction_bias else None
        )

    def activation_bytes(self, num_tokens: int) -> int:
        """The most this layer holds at once beyond its weights in a `num_tokens` step: the
        router's logits and float32 scores [T, E], the choices, the experts' workspace and
        the shared expert's gate/up and activation."""
        item = self.experts.w13_weight.element_size()
        top_k, num_experts = self.routing.top_k, self.experts.num_experts
        routing = num_tokens * (num_experts * (item + 8) + top_k * (8 + 4 + item))
        shared = 0
        if self.shared_expert is not None:
            gate_up = getattr(self.shared_expert, "gate_up_proj", None)
            shared_size = gate_up.weight.shape[0] // 2 if gate_up is not None else 0
            shared = num_tokens * 3 * shared_size * item
        workspace = self.compute_experts.workspace_bytes(
            num_tokens, top_k, self.experts, self.act_and_mul
        )
        return routing + workspace + shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        weights, ids = select_experts(self.gate(x), self.routing, self.e_score_correction_bias)
        out = self.compute_experts(x, self.experts, weights, ids, self.act_and_mul)
        # the shared expert's partial sum joins the routed experts' (a gate is replicated)
        if self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        elif self.shared_expert is not None:
            out = out + self.shared_expert(x)
        return all_reduce(out)  # the layer's one all-reduce
