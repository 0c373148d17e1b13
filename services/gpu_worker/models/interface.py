"""The contract every model architecture meets, and the registry is typed to.

A model file describes its architecture and nothing else: layers over the shared ones in
`layers/`, its checkpoint's weight names, and what each layer keeps in the KV cache. It knows
nothing of the platform (ops choose their form when built; a platform may swap linear methods
or run a fused pass of its own) nor of tensor parallelism (the layers shard themselves).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.shared.kv_cache_spec import KVCacheSpec


class BaseCausalLM(nn.Module, ABC):
    """A decoder-only language model over a paged KV cache, one (K, V) pair per layer (a
    latent layer's one tensor twice: `KVCacheSpec.is_latent`)."""

    config: Any

    @abstractmethod
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__()

    takes_logit_rows = False  # forward also takes `logit_rows=` (see `ForwardPass`)

    @abstractmethod
    def forward(
        self,
        token_ids: torch.Tensor,  # [T] every scheduled token of the step, packed by sequence
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] final hidden states (after the last norm)
        """One step: write every token's K/V, attend, return the final hidden states."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[B, H] -> [B, vocab] in the model's dtype on rank 0, None on other ranks."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load full checkpoint tensors by Hugging Face name; returns what was loaded, in
        the terms of `expected_weights`. A tensor with no place is an error naming it."""

    @abstractmethod
    def expected_weights(self) -> set[str]:
        """What `load_weights` must have seen for the model to be complete."""

    @abstractmethod
    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """What each layer keeps in the KV cache, in layer order."""

    @property
    @abstractmethod
    def num_kv_heads(self) -> int:
        """KV heads of this rank (the KV cache's width)."""

    @property
    @abstractmethod
    def head_dim(self) -> int: ...

    @property
    def num_layers(self) -> int:
        return len(self.kv_cache_specs())
