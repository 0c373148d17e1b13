"""The step clock of a benchmark level: pagedserve's engine counters read from /metrics text,
settled by `run_levels` into shares of the level's wall time, and turned into per-step times."""

from __future__ import annotations

import pytest

from benchmarks import step_clock
from benchmarks.vs_vllm_report import step_clock_rows
from pagedserve.services.cli.loadgen.engine_time import COUNTERS, engine_time_shares
from pagedserve.services.cli.loadgen.status_sampler import parse_prometheus_gauges

PAGE = """\
# HELP vllm:iteration_tokens_total Tokens per engine step
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="e0",le="+Inf"} 40.0
vllm:iteration_tokens_total_count{engine="e0"} 40.0
vllm:iteration_tokens_total_count{engine="e1"} 10.0
pagedserve:worker_execute_seconds_total{engine="e0"} 2.0
pagedserve:worker_execute_seconds_total{engine="e1"} 0.5
"""


def test_the_counters_are_summed_over_engines():
    names = (COUNTERS["steps"], COUNTERS["execute"])
    assert parse_prometheus_gauges(PAGE, names) == pytest.approx(
        {COUNTERS["steps"]: 50.0, COUNTERS["execute"]: 2.5}
    )


def test_a_server_without_them_has_no_step_clock():
    assert step_clock.step_clock(None, 1.0) is None


def test_per_step_times_over_a_level():
    before = {"steps": 10.0, "execute": 1.0, "in_flight": 1.2, "scheduling": 0.0,
              "draft_tokens": 0.0, "accepted_tokens": 0.0, "planned_ahead": 0.0}  # fmt: skip
    after = {**before, "steps": 110.0, "execute": 6.0, "in_flight": 6.5}
    shares = engine_time_shares(before, after, wall_s=6.25)
    clock = step_clock.step_clock(shares, wall_s=6.25)
    assert clock == pytest.approx(
        {"steps": 100, "execute_ms_per_step": 50.0, "outside_execute_ms_per_step": 3.0,
         "execute_share": 0.8}
    )  # fmt: skip
    no_step = engine_time_shares(after, after, wall_s=6.25)
    assert step_clock.step_clock(no_step, wall_s=6.25) is None  # no step ran


def test_the_report_gives_the_median_over_rounds():
    def round_(steps: int, execute_ms: float) -> dict:
        clock = {"steps": steps, "execute_ms_per_step": execute_ms,
                 "outside_execute_ms_per_step": 2.0, "execute_share": 0.9}  # fmt: skip
        return {"points": [{"max_concurrency": 64, "request_rate": None, "step_clock": clock}]}

    rounds = [round_(300, 50.0), round_(320, 54.0), round_(310, 52.0)]
    assert step_clock_rows(rounds) == ["| 64 in flight | 310 | 52.0 | 2.00 | 90.0% |"]
    assert step_clock_rows([{"points": [{"max_concurrency": 4, "step_clock": None}]}]) == []
