"""What a model layer keeps in the KV cache, as the worker reports it and the scheduler's KV
manager reads it (vLLM's `KVCacheSpec`): every token of the sequence (full attention) or only
the last `sliding_window` tokens each query may see, and what one token takes: a key and a
value per KV head, or (multi-head latent attention, DeepSeek-V2/V3) one compressed latent
of `latent_dim` features and a shared rotary key of `latent_rope_dim`, whatever the heads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    sliding_window: int | None = None  # None: full attention
    latent_dim: int | None = None  # MLA's kv_lora_rank; None: a key and a value per head
    latent_rope_dim: int = 0  # MLA's qk_rope_head_dim, stored beside the latent

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        if self.latent_dim is not None and (self.latent_dim < 1 or self.latent_rope_dim < 0):
            raise ValueError(
                f"latent KV needs latent_dim >= 1 and latent_rope_dim >= 0, got "
                f"{self.latent_dim} and {self.latent_rope_dim}"
            )

    @property
    def is_latent(self) -> bool:
        return self.latent_dim is not None

    def token_elements(self, num_kv_heads: int, head_dim: int) -> int:
        """Elements one token keeps in this layer's cache: latent + rope key for a latent
        layer, else a key and a value of `head_dim` for each of `num_kv_heads` heads."""
        if self.latent_dim is not None:
            return self.latent_dim + self.latent_rope_dim
        return 2 * num_kv_heads * head_dim

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
