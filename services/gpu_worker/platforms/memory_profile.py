"""What the CUDA memory profile leaves out of the KV cache: the measured peak of the worst
step, and never less than the weights plus the largest MoE layer's activations at that step.

The profile runs the largest step the scheduler can send and measures its peak; when its
MoE layers run the fused kernel, their buffers are in that peak. The floor makes the
reservation hold whatever the profile step measured: a MoE layer's workspace at the token
budget (tokens x top_k x (intermediate + hidden), the routing's [T, E] scores, the shared
expert) is reserved from the layer's shapes (`FusedMoE.activation_bytes`), so a step of
the full budget cannot run out of memory that the KV cache took. Layers run one after
another: the largest layer's activations count, not their sum.
"""

from __future__ import annotations

from torch import nn

from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def moe_activation_bytes(model: nn.Module, num_tokens: int) -> int:
    """The largest `FusedMoE.activation_bytes` of the model's layers (0: no MoE layer)."""
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    return max((layer.activation_bytes(num_tokens) for layer in layers), default=0)


def reserved_bytes(model: nn.Module, num_tokens: int, measured_peak: int) -> int:
    """What the KV cache must leave free: the profile's peak without its throwaway cache,
    at least the weights and the largest MoE layer's activations of `num_tokens`."""
    floor = parameter_bytes(model) + moe_activation_bytes(model, num_tokens)
    return max(measured_peak, floor)
