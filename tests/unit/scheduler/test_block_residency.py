"""KV block residency (vLLM's --kv-cache-metrics): what the block pool reports when a followed
block is allocated, hit and evicted, on a clock the test moves."""

from __future__ import annotations

import random

import pytest

from pagedserve.services.scheduler import block_residency
from pagedserve.services.scheduler.block_pool import BlockPool
from pagedserve.services.scheduler.block_residency import BlockResidency
from pagedserve.shared.metric_buckets import KV_CACHE_RESIDENCY_BUCKETS
from pagedserve.shared.status_histogram import decode_histogram


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(block_residency.time, "monotonic", lambda: now[0])
    return now


def decoded(text: str) -> tuple[list[int], int, float]:
    result = decode_histogram(text, KV_CACHE_RESIDENCY_BUCKETS)
    assert result is not None
    return result


def test_lifetime_idle_time_and_reuse_gaps_of_a_followed_block(clock):
    pool = BlockPool(2)
    pool.residency = BlockResidency(1.0)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    for at in (101.0, 103.0):  # two prefix-cache hits, 2 s apart
        clock[0] = at
        pool.touch([block])
        pool.free_blocks([block])
    clock[0] = 110.0
    pool.get_new_blocks(2)  # takes the other free block, then evicts ours
    fields = pool.residency.status_fields()
    lifetime, idle, gaps = (decoded(fields[f"kv_block_{n}"]) for n in
                            ("lifetime", "idle_before_evict", "reuse_gap"))  # fmt: skip
    assert (lifetime[1], lifetime[2]) == (1, 10.0)
    assert (idle[1], idle[2]) == (1, 7.0)
    assert (gaps[1], gaps[2]) == (1, 2.0)
    bound = KV_CACHE_RESIDENCY_BUCKETS.index(10)
    assert lifetime[0][bound] == 1 and lifetime[0][bound - 1] == 0  # le="10" holds 10 s
    # the other block was allocated (not evicted) once, and both are followed again
    assert pool.residency.num_followed == 2


def test_only_the_sampled_fraction_is_followed():
    residency = BlockResidency(0.25, random.Random(7))
    for block_id in range(4000):
        residency.allocated(block_id)
    assert 800 < residency.num_followed < 1200
    for block_id in range(4000):
        residency.evicted(block_id)
    assert decoded(residency.lifetime.encode())[1] == residency.lifetime.num
    assert residency.lifetime.num == residency.idle_before_evict.num
    assert 800 < residency.lifetime.num < 1200 and residency.num_followed == 0


def test_a_reset_cache_ends_the_lives_unobserved(clock):
    pool = BlockPool(1)
    pool.residency = BlockResidency(1.0)
    pool.free_blocks(pool.get_new_blocks(1))
    pool.reset_prefix_cache()
    pool.get_new_blocks(1)
    assert pool.residency.lifetime.num == 0


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_a_sample_rate_outside_0_1_is_refused(rate):
    with pytest.raises(ValueError, match="kv_cache_metrics_sample must be in"):
        BlockResidency(rate)
