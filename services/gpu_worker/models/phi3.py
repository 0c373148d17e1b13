"""Phi-3 (mini, small, medium): the Llama layer, its checkpoint holding q/k/v as one
`qkv_proj` tensor and gate/up as one `gate_up_proj`, with longrope scaling (see
`layers/rope_scaling.py`: the long factors from the original length on, per position)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from pagedserve.services.gpu_worker.models.decoder_base import attention_geometry
from pagedserve.services.gpu_worker.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_fused(weights))

    def _split_fused(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's fused q/k/v and gate/up tensors as the separate ones that the
        shared layers load (each rank then takes its slice of each)."""
        num_heads, num_kv_heads, head_dim = attention_geometry(self.config)
        qkv_sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        for name, tensor in weights:
            if name.endswith("self_attn.qkv_proj.weight"):
                parts = tensor.split(qkv_sizes, dim=0)
                for part_name, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                    yield name.replace("qkv_proj", part_name), part
            elif name.endswith("mlp.gate_up_proj.weight"):
                gate, up = tensor.chunk(2, dim=0)
                yield name.replace("gate_up_proj", "gate_proj"), gate
                yield name.replace("gate_up_proj", "up_proj"), up
            else:
                yield name, tensor
