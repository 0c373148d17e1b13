"""Config defaults and bounds: the block size is the workers' device default unless given."""

from __future__ import annotations

import pytest

from shared.config import CacheConfig, default_block_size


def test_default_block_size_is_8_on_cpu_and_16_on_cuda() -> None:
    assert default_block_size("cpu") == 8
    assert default_block_size("cuda") == 16


def test_cache_config_leaves_the_block_size_to_the_workers() -> None:
    assert CacheConfig().block_size is None
    assert CacheConfig(block_size=32).block_size == 32


def test_an_explicit_block_size_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="block_size must be a power of two >= 1, got 12"):
        CacheConfig(block_size=12)
    with pytest.raises(ValueError, match="got 0"):
        CacheConfig(block_size=0)
