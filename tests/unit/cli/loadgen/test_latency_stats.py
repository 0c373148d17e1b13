from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedserve.services.cli.loadgen.latency_stats import (
    RequestRecord,
    distribution,
    percentile,
    summarize,
)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0, 100),
)
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-6)


def test_percentile_on_known_data() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_distribution_is_in_milliseconds() -> None:
    assert distribution([0.1, 0.2, 0.3]) == pytest.approx(
        {"mean": 200.0, "p50": 200.0, "p90": 280.0, "p99": 298.0}
    )
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def _record(start: float, chunks: list[float], end: float, num_tokens: int) -> RequestRecord:
    return RequestRecord(10, num_tokens, start, chunks, end, num_tokens)


def test_request_timings() -> None:
    r = _record(1.0, [1.5, 1.6, 1.8, 2.1], 2.2, 4)
    assert r.ttft == pytest.approx(0.5)
    assert r.tpot == pytest.approx(0.2)  # (2.1 - 1.5) / 3
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])
    assert r.e2e == pytest.approx(1.2)
    single = _record(0.0, [0.3], 0.4, 1)
    assert single.tpot is None and single.itls == []
    empty = _record(0.0, [], 0.4, 0)
    assert empty.ttft is None


def test_summary_counts_failures_and_throughput() -> None:
    ok = [_record(0.0, [0.5, 1.0], 1.0, 2), _record(0.0, [1.0, 1.5, 2.0], 2.0, 3)]
    failed = RequestRecord(7, 5, 0.0, [], 0.1, 0, error="HTTP 503: queue full")
    summary = summarize([*ok, failed], duration_s=2.0)
    assert summary["num_completed"] == 2 and summary["num_failed"] == 1
    assert summary["errors"] == ["HTTP 503: queue full"]
    assert summary["output_throughput"] == pytest.approx(2.5)  # 5 tokens / 2 s
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["total_prompt_tokens"] == 20
    assert summary["ttft_ms"]["mean"] == pytest.approx(750.0)
    assert summary["itl_ms"]["p50"] == pytest.approx(500.0)
    assert summary["num_wrong_length"] == 0
    with pytest.raises(ValueError, match="duration_s"):
        summarize(ok, 0.0)
