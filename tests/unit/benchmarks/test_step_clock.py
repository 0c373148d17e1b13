"""The step clock of a benchmark level: pagedserve's engine counters read from /metrics text,
read once they settle, and turned into per-step times."""

from __future__ import annotations

import pytest

from benchmarks import step_clock
from benchmarks.step_clock import parse_counters, read_settled
from benchmarks.vs_vllm_report import step_clock_rows
from pagedserve.services.cli.loadgen.engine_time import MAX_SETTLE_READS

PAGE = """\
# HELP vllm:iteration_tokens_total Tokens per engine step
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="e0",le="1.0"} 3.0
vllm:iteration_tokens_total_bucket{engine="e0",le="+Inf"} 40.0
vllm:iteration_tokens_total_count{engine="e0"} 40.0
vllm:iteration_tokens_total_sum{engine="e0"} 900.0
vllm:iteration_tokens_total_bucket{engine="e1",le="1.0"} 1.0
vllm:iteration_tokens_total_bucket{engine="e1",le="+Inf"} 10.0
vllm:iteration_tokens_total_count{engine="e1"} 10.0
vllm:iteration_tokens_total_sum{engine="e1"} 100.0
# HELP pagedserve:worker_execute_seconds Seconds the model computed steps (rank 0)
# TYPE pagedserve:worker_execute_seconds counter
pagedserve:worker_execute_seconds_total{engine="e0"} 2.0
pagedserve:worker_execute_seconds_total{engine="e1"} 0.5
# HELP pagedserve:step_in_flight_seconds Seconds from each plan out to its result in
# TYPE pagedserve:step_in_flight_seconds counter
pagedserve:step_in_flight_seconds_total{engine="e0"} 2.1
pagedserve:step_in_flight_seconds_total{engine="e1"} 0.6
"""


def test_the_counters_are_summed_over_engines():
    assert parse_counters(PAGE) == pytest.approx(
        {"steps": 50.0, "execute_s": 2.5, "in_flight_s": 2.7}
    )


def test_a_server_without_them_has_no_step_clock():
    vllm_like = PAGE.replace("pagedserve:step_in_flight", "other:in_flight")
    assert parse_counters(vllm_like) is None
    assert step_clock.step_clock(None, {"steps": 1.0}, 1.0) is None


def test_per_step_times_over_a_level():
    before = {"steps": 10.0, "execute_s": 1.0, "in_flight_s": 1.2}
    after = {"steps": 110.0, "execute_s": 6.0, "in_flight_s": 6.5}
    clock = step_clock.step_clock(before, after, wall_s=6.25)
    assert clock == pytest.approx(
        {"steps": 100, "execute_ms_per_step": 50.0, "outside_execute_ms_per_step": 3.0,
         "execute_share": 0.8}
    )  # fmt: skip
    assert step_clock.step_clock(after, after, wall_s=6.25) is None  # no step ran


def test_a_reading_waits_until_two_reads_agree(monkeypatch):
    reads = iter([{"steps": 1.0}, {"steps": 3.0}, {"steps": 4.0}, {"steps": 4.0}, {"steps": 9.0}])
    monkeypatch.setattr(step_clock, "read_counters", lambda url: next(reads))
    assert read_settled("http://x", interval_s=0) == {"steps": 4.0}
    monkeypatch.setattr(step_clock, "read_counters", lambda url: None)
    assert read_settled("http://x", interval_s=0) is None


def test_the_report_gives_the_median_over_rounds():
    def round_(steps: int, execute_ms: float) -> dict:
        clock = {"steps": steps, "execute_ms_per_step": execute_ms,
                 "outside_execute_ms_per_step": 2.0, "execute_share": 0.9}  # fmt: skip
        return {"points": [{"max_concurrency": 64, "request_rate": None, "step_clock": clock}]}

    rounds = [round_(300, 50.0), round_(320, 54.0), round_(310, 52.0)]
    assert step_clock_rows(rounds) == ["| 64 in flight | 310 | 52.0 | 2.00 | 90.0% |"]
    assert step_clock_rows([{"points": [{"max_concurrency": 4, "step_clock": None}]}]) == []


def test_a_reading_that_never_settles_is_the_last_one_read(monkeypatch):
    reads = iter([{"steps": float(i)} for i in range(20)])
    monkeypatch.setattr(step_clock, "read_counters", lambda url: next(reads))
    assert read_settled("http://x", interval_s=0) == {"steps": float(MAX_SETTLE_READS)}
