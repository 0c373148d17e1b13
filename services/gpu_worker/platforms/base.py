"""The platform seam: what differs between the machines a worker runs on, decided once.

A platform owns the defaults (dtype, KV block size, step token budget, attention backend),
the process set-up (the CUDA device, the CPU's thread count), what happens to a model once its
weights are loaded (the CPU packs its linears), which forward pass runs (the model's modules,
or a fused pass the platform builds for it), how many KV blocks fit, and the warm-up before the
worker says it is ready. The model runner asks the platform and never the device type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.layers.custom_op import op_form
from pagedserve.services.gpu_worker.warmup import AttentionShape
from pagedserve.shared.config import (
    CacheConfig,
    default_block_size,
    default_max_num_batched_tokens,
    default_num_speculative_tokens,
)

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.models.interface import BaseCausalLM

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class ForwardPass(Protocol):
    """A step's forward pass. One whose `takes_logit_rows` is True also takes `logit_rows`
    ([R] row indices): the rows the step reads its logits from; it may leave the other rows of
    its result zero (their keys and values still go to the cache)."""

    def __call__(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: KVCaches,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] final hidden states
        ...


@dataclass(frozen=True, slots=True)
class KVSizing:
    """What deciding the number of KV blocks may look at."""

    model: BaseCausalLM
    layout: KVCacheLayout
    cache_config: CacheConfig
    max_num_batched_tokens: int  # the worst step's tokens
    max_num_seqs: int  # the worst step's sampler rows
    max_model_len: int


class BasePlatform(ABC):
    device_type: ClassVar[str]
    default_attention_backend: ClassVar[str]

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def op_form(self) -> str:
        """Which `forward_*` of a `CustomOp` built for this platform runs."""
        return op_form(self.device)

    @abstractmethod
    def set_up_process(self, rank: int, world_size: int) -> None:
        """Make this process ready to compute on the device (called once, before loading)."""

    @abstractmethod
    def default_dtype(self) -> torch.dtype:
        """The dtype `dtype="auto"` means here."""

    def default_block_size(self) -> int:
        return default_block_size(self.device_type)

    def default_max_num_batched_tokens(self, forward_pass: ForwardPass) -> int:
        """The step token budget when none is given, for steps through `forward_pass`."""
        return default_max_num_batched_tokens(self.device_type)

    def default_num_speculative_tokens(self) -> int:
        """The n-gram drafts the scheduler uses when given no number (it adopts rank 0's)."""
        return default_num_speculative_tokens(self.device_type)

    def prepare_model(self, model: BaseCausalLM, world_size: int) -> None:  # noqa: B027
        """Called once the weights are loaded (e.g. to give layers another linear method)."""

    def forward_pass(self, model: BaseCausalLM) -> ForwardPass:
        """The forward pass a step runs: the model's modules unless the platform has a
        faster one that gives the same results."""
        return model

    @abstractmethod
    def num_kv_blocks(self, sizing: KVSizing) -> int:
        """How many KV blocks to allocate when the cache config names no count."""

    def warm_up(  # noqa: B027
        self, kv_caches: KVCaches, attention: AttentionShape | None, vocab_size: int
    ) -> None:
        """Run what must be compiled before the worker says it is ready; `attention` is the
        geometry when the Triton kernels serve it."""
