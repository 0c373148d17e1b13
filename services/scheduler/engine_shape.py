"""The engine's shape: how big its KV cache is and how much one step and one sequence may hold.

Derived once, from the workers' hellos and the flags, by the scheduler process and the
in-process `LLMEngine` alike: a flag that was given wins, else the workers' (device-dependent)
default; the cache holds what every rank can hold; a sequence is as long as the shortest
limit allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.kv_cache_spec import reclaimable_window
from pagedserve.shared.protocol import WorkerHello


@dataclass(frozen=True, slots=True)
class EngineShape:
    block_size: int  # tokens per KV block
    num_blocks: int  # KV blocks every rank holds
    max_num_batched_tokens: int  # tokens computed in one step
    max_model_len: int  # prompt + output tokens of one sequence
    vocab_size: int  # token ids are below this; 0: unknown (no check)
    sliding_window: int | None = None  # blocks before every layer's window are given back
    num_speculative_tokens: int = 0  # n-gram drafts per sequence and step; 0: off

    @classmethod
    def derive(
        cls,
        hellos: Sequence[WorkerHello],
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
    ) -> EngineShape:
        """The shape of an engine whose ranks said `hellos`, under the given flags."""
        if not hellos:
            raise ValueError("an engine's shape needs at least one worker hello")
        rank0 = min(hellos, key=lambda h: h.rank)
        vocab_sizes = [h.vocab_size for h in hellos if h.vocab_size > 0]
        return cls(
            block_size=cache_config.block_size or rank0.block_size,
            num_blocks=min(h.num_blocks for h in hellos),
            max_num_batched_tokens=(
                scheduler_config.max_num_batched_tokens or rank0.max_num_batched_tokens
            ),
            max_model_len=min(scheduler_config.max_model_len, *(h.max_model_len for h in hellos)),
            vocab_size=min(vocab_sizes, default=0),
            sliding_window=reclaimable_window(rank0.sliding_windows),
            num_speculative_tokens=(
                rank0.num_speculative_tokens
                if scheduler_config.num_speculative_tokens is None
                else scheduler_config.num_speculative_tokens
            ),
        )

    def scheduler_config(self, flags: SchedulerConfig) -> SchedulerConfig:
        return replace(
            flags,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_speculative_tokens=self.num_speculative_tokens,
        )

    def cache_config(self, flags: CacheConfig) -> CacheConfig:
        return replace(
            flags,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            sliding_window=self.sliding_window,
        )

    def describe(self) -> str:
        return (
            f"{self.num_blocks} KV blocks of {self.block_size} tokens, max_model_len "
            f"{self.max_model_len}, {self.max_num_batched_tokens} tokens per step, "
            f"{self.num_speculative_tokens} n-gram drafts per sequence"
        )
