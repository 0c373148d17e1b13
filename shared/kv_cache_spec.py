"""What a model layer keeps in the KV cache, as the worker reports it and the scheduler's KV
manager reads it (vLLM's `KVCacheSpec`): every token of the sequence (full attention) or only
the last `sliding_window` tokens each query may see."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    sliding_window: int | None = None  # None: full attention

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")

    @property
    def is_full(self) -> bool:
        return self.sliding_window is None


FULL_ATTENTION = KVCacheSpec()


def reclaimable_window(windows: list[int | None]) -> int | None:
    """The window past which a shared block table's blocks are read by no layer: the widest,
    when every layer has one; None when any layer attends to everything (or none are known)."""
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)
