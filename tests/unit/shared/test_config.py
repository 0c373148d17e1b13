"""Config defaults and bounds: the block size and the per-step token budget are the workers'
device defaults unless given."""

from __future__ import annotations

import pytest

from pagedserve.shared.config import (
    CacheConfig,
    SchedulerConfig,
    default_block_size,
    default_max_num_batched_tokens,
)


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


def test_default_max_num_batched_tokens_is_512_on_cpu_and_2048_on_cuda() -> None:
    assert default_max_num_batched_tokens("cpu") == 512
    assert default_max_num_batched_tokens("cuda") == 2048


def test_scheduler_config_leaves_the_token_budget_to_the_workers() -> None:
    assert SchedulerConfig().max_num_batched_tokens is None
    assert SchedulerConfig(max_num_batched_tokens=4096).max_num_batched_tokens == 4096
    # without chunked prefill an unset budget is not compared with max_model_len (yet)
    assert SchedulerConfig(enable_chunked_prefill=False).max_num_batched_tokens is None


def test_an_explicit_token_budget_is_checked() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1, got 0"):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(
        ValueError, match=r"without chunked prefill, max_num_batched_tokens \(512\)"
    ):
        SchedulerConfig(max_num_batched_tokens=512, enable_chunked_prefill=False)
