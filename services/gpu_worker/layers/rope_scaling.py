"""Rotary angles for a config's rope scaling, by the Hugging Face definitions so that tokens
match: "default", "linear", "llama3" and "yarn" (one set of inverse frequencies for every
position, yarn also scaling cos and sin), "dynamic" (NTK) and "longrope" (the frequencies
depend on the sequence's length).

Hugging Face picks the dynamic and longrope frequencies per forward call, from the longest
position in it, and keeps what it cached. Here a token's frequencies follow from its own
position: at position p, those of a sequence p + 1 long. That is Hugging Face's choice for
every decoded token and for prompts within the original length; a prompt longer than the
original length is rotated by Hugging Face with the frequencies of its whole length instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def rope_type_of(scaling: dict[str, Any] | None) -> str:
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(scaling: dict[str, Any]) -> float:
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all = (scaling.get(k) for k in ("factor", "mscale", "mscale_all_dim"))
    if mscale and mscale_all:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return _yarn_mscale(factor)


def _yarn_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no singular ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The inverse frequencies of positions within the original length, [D/2]; an
    unsupported rope type is refused naming it."""
    rope_type = rope_type_of(scaling)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    assert scaling is not None or rope_type == "default"
    if rope_type == "linear":
        return _inv_freq(head_dim, theta) / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(_inv_freq(head_dim, theta), scaling)
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    if rope_type == "longrope":
        return _longrope_inv_freq(head_dim, theta, scaling["short_factor"])
    return _inv_freq(head_dim, theta)  # default, and dynamic within the original length


def _longrope_inv_freq(head_dim: int, theta: float, factors: list[float]) -> torch.Tensor:
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**shape)


def _dynamic_inv_freqs(
    head_dim: int, theta: float, factor: float, original: int, positions: torch.Tensor
) -> torch.Tensor:  # [P, D/2], each position's as for a sequence ending there
    seq_lens = (positions + 1).clamp(min=original).double()
    bases = theta * ((factor * seq_lens / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (bases.float()[:, None] ** shape[None, :])


def table_length(max_position: int, scaling: dict[str, Any] | None) -> int:
    """Positions the angle table covers: dynamic NTK serves `factor` times the config's."""
    if rope_type_of(scaling) == "dynamic":
        return int(max_position * scaling["factor"])  # type: ignore[index]
    return max_position


def rope_angles(
    head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, [P, D/2] each, float32."""
    rope_type = rope_type_of(scaling)
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    positions = torch.arange(table_length(max_position, scaling))
    freqs = torch.outer(positions.float(), inv_freq)  # [P, D/2]
    attention_factor = 1.0
    if rope_type == "dynamic":
        dynamic = _dynamic_inv_freqs(head_dim, theta, scaling["factor"], max_position, positions)
        freqs = torch.where(
            (positions >= max_position)[:, None], positions[:, None] * dynamic, freqs
        )
    elif rope_type == "yarn":
        attention_factor = yarn_attention_factor(scaling)
    elif rope_type == "longrope":
        original = scaling["original_max_position_embeddings"]
        long = _longrope_inv_freq(head_dim, theta, scaling["long_factor"])
        freqs = torch.where(
            (positions >= original)[:, None], torch.outer(positions.float(), long), freqs
        )
        attention_factor = longrope_attention_factor(scaling, max_position)
    return freqs.cos() * attention_factor, freqs.sin() * attention_factor


def longrope_attention_factor(scaling: dict[str, Any], max_position: int) -> float:
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
