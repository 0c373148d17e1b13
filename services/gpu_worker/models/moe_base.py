"""What mixture-of-experts decoders add to `DecoderLM`: the checkpoint's per-expert tensors
(`layers.0.mlp.experts.3.w1.weight`) go into the layer's stacked expert weights, each
expected once per expert and part, so a missing expert is named at load; and the Qwen MoEs'
choice of a dense or an expert MLP per layer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.layers.fused_moe import (
    EXPERT_CHECKPOINT_NAME,
    EXPERT_PARTS,
    PARTS_OF,
    FusedMoE,
    StackedExperts,
)
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value


def is_moe_layer(config: Any, index: int) -> bool:
    """Whether layer `index` has experts (Qwen MoEs: not in `mlp_only_layers`, and every
    `decoder_sparse_step`-th layer)."""
    step = config_value(config, "decoder_sparse_step", 1)
    return index not in config_value(config, "mlp_only_layers", []) and (index + 1) % step == 0


def qwen_moe_mlp(config: Any, index: int, shared_expert: nn.Module | None = None) -> nn.Module:
    """Layer `index`'s MLP in a Qwen MoE: experts (renormalised where `norm_topk_prob`),
    or a dense MLP of `intermediate_size` in the layers `is_moe_layer` leaves out."""
    act = config_value(config, "hidden_act", "silu")
    if not is_moe_layer(config, index):
        return GatedMLP(config.hidden_size, config.intermediate_size, act)
    return FusedMoE(
        config.hidden_size,
        config.moe_intermediate_size,
        config.num_experts,
        Routing(
            config.num_experts_per_tok,
            renormalize=bool(config_value(config, "norm_topk_prob", False)),
        ),
        hidden_act=act,
        shared_expert=shared_expert,
    )


class MoEDecoderLM(DecoderLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        experts = {name: m for name, m in self.named_modules() if isinstance(m, StackedExperts)}
        loaded: set[str] = set()

        def dense(pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for hf_name, tensor in pairs:
                name = self.checkpoint_name(hf_name)
                match = EXPERT_CHECKPOINT_NAME.match(name or "")
                if match is None:
                    yield hf_name, tensor
                    continue
                module = experts.get(match["prefix"])
                if module is None:
                    raise ValueError(f"checkpoint tensor {hf_name!r} has no place in the model")
                param, part = EXPERT_PARTS[match["projection"]]
                module.load_expert(int(match["expert"]), part, tensor)
                loaded.add(f"{match['prefix']}.{param}:{match['expert']}:{part}")

        return super().load_weights(dense(weights)) | loaded

    def expected_weights(self) -> set[str]:
        expected = super().expected_weights()
        for prefix, module in self.named_modules():
            if isinstance(module, StackedExperts):
                for param, parts in PARTS_OF.items():
                    expected.discard(f"{prefix}.{param}")
                    expected.update(
                        f"{prefix}.{param}:{e}:{p}"
                        for e in range(module.num_experts)
                        for p in parts
                    )
        return expected
