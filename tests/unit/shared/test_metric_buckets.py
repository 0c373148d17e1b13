"""vLLM's bucket bounds and the status-record histogram that carries engine-side ones."""

from __future__ import annotations

import pytest

from pagedserve.shared.metric_buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    request_tokens_buckets,
)
from pagedserve.shared.status_histogram import StatusHistogram, decode_histogram


def test_request_token_buckets_are_1_2_5_up_to_the_model_length():
    assert request_tokens_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert request_tokens_buckets(1) == (1,)
    with pytest.raises(ValueError, match="max_model_len must be >= 1"):
        request_tokens_buckets(0)


@pytest.mark.parametrize(
    "bounds",
    [REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS,
     REQUEST_NUM_PREEMPTIONS_BUCKETS],
)  # fmt: skip
def test_bounds_increase(bounds):
    assert list(bounds) == sorted(set(bounds))


def test_vllm_032_edges():
    assert (REQUEST_LATENCY_BUCKETS[0], REQUEST_LATENCY_BUCKETS[-1]) == (0.3, 7680.0)
    assert TIME_TO_FIRST_TOKEN_BUCKETS[-1] == 2560.0 and len(TIME_TO_FIRST_TOKEN_BUCKETS) == 22
    assert (INTER_TOKEN_LATENCY_BUCKETS[0], INTER_TOKEN_LATENCY_BUCKETS[-1]) == (0.01, 80.0)
    assert REQUEST_NUM_PREEMPTIONS_BUCKETS == (1, 2, 3, 4, 5, 10, 20)


def test_status_histogram_round_trips_with_prometheus_le_semantics():
    histogram = StatusHistogram((1, 5, 10))
    for value in (0, 1, 1.5, 5, 11):
        histogram.observe(value)
    cumulative, count, total = decode_histogram(histogram.encode(), (1, 5, 10))
    assert cumulative == [2, 4, 4] and count == 5 and total == 18.5


@pytest.mark.parametrize("text", ["", "1,2", "1,2,x,4,5", "a,b,c,d,e"])
def test_a_foreign_field_decodes_to_none(text):
    assert decode_histogram(text, (1, 5, 10)) is None
