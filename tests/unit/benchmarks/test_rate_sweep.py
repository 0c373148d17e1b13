"""The rate sweep: its Poisson arrival schedules (seeded, at the asked mean rate), the steal
filter, the medians over rounds, and one round measured against a fake server."""

from __future__ import annotations

import itertools
import statistics

import pytest

from benchmarks.rate_sweep import (
    arrival_schedule,
    level_name,
    median_over_rounds,
    point,
    stolen,
    sweep_loads,
)
from benchmarks.vs_vllm import measure_round
from pagedserve.services.cli.loadgen.runner import plan_levels
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload
from tests.unit.benchmarks.fake_openai_server import fake_openai_server
from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer


def test_the_sweep_has_the_concurrency_levels_then_one_seeded_level_per_rate() -> None:
    loads = sweep_loads([16, 64], [0.5, 2.0], seed=7)
    assert [(ld.max_concurrency, ld.request_rate) for ld in loads[:2]] == [
        (16, float("inf")),
        (64, float("inf")),
    ]
    assert [(ld.max_concurrency, ld.request_rate) for ld in loads[2:]] == [(None, 0.5), (None, 2.0)]
    assert len({ld.seed for ld in loads[2:]}) == 2  # each rate its own gaps
    with pytest.raises(ValueError, match="rates must be > 0"):
        sweep_loads([16], [1.0, 0.0], seed=0)


def test_arrivals_are_seeded_start_at_zero_and_keep_the_mean_rate() -> None:
    load = sweep_loads([], [4.0], seed=3)[0]
    times = arrival_schedule(load, 4000)
    assert times == arrival_schedule(load, 4000)  # same seed, same schedule
    assert times != arrival_schedule(sweep_loads([], [4.0], seed=4)[0], 4000)
    assert times[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(times))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)  # 1 / rate
    # exponential gaps: the standard deviation equals the mean (a fixed pace would give 0)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)


def _point(tok_s: float, ttft_p99: float, steal: float | None, rate: float | None = 1.0) -> dict:
    summary = {
        "request_rate": rate if rate is not None else "inf",
        "max_concurrency": None if rate is not None else 16,
        "num_completed": 4,
        "num_failed": 0,
        "duration_s": 2.0,
        "output_throughput": tok_s,
        "ttft_ms": {"p50": ttft_p99 / 2, "p99": ttft_p99},
        "tpot_ms": {"p50": 10.0, "p99": 20.0},
    }
    return point(summary, steal)


def test_a_point_with_steal_over_the_limit_is_thrown_out() -> None:
    assert stolen(_point(1, 1, 0.11), max_steal=0.10)
    assert not stolen(_point(1, 1, 0.10), max_steal=0.10)
    assert not stolen(_point(1, 1, None), max_steal=0.10)  # no /proc/stat: nothing known


def test_each_metric_is_the_median_of_the_rounds_without_steal() -> None:
    rounds = [
        [_point(100.0, 500.0, 0.01, rate=None), _point(50.0, 300.0, 0.00)],
        [_point(900.0, 10.0, 0.30, rate=None), _point(70.0, 100.0, 0.02)],  # level 0 stolen
        [_point(120.0, 400.0, 0.02, rate=None), _point(60.0, 200.0, 0.50)],  # level 1 stolen
    ]
    levels = median_over_rounds(rounds, max_steal=0.10)
    assert levels[0]["output_tok_s"] == 110.0 and levels[0]["ttft_p99_ms"] == 450.0
    assert levels[0]["rounds_kept"] == [1, 3] and levels[0]["rounds_thrown_out"] == [2]
    assert levels[1]["output_tok_s"] == 60.0 and levels[1]["ttft_p50_ms"] == 100.0
    assert levels[1]["rounds_thrown_out"] == [3]
    assert [level_name(lvl) for lvl in levels] == ["16 in flight", "1 req/s"]


def test_a_level_stolen_in_every_round_has_no_median() -> None:
    levels = median_over_rounds([[_point(10.0, 1.0, 0.5)], [_point(20.0, 1.0, 0.4)]], 0.10)
    assert levels[0]["output_tok_s"] is None and levels[0]["rounds_kept"] == []
    with pytest.raises(ValueError):
        median_over_rounds([], 0.10)
    with pytest.raises(ValueError):  # rounds must measure the same levels
        median_over_rounds([[_point(1, 1, 0)], []], 0.10)


def test_a_round_measures_every_level_with_its_steal() -> None:
    tokenizer = FakeTokenizer()
    prompts = LengthDistribution(median=8, sigma=0.5, min_len=4, max_len=20)
    outputs = LengthDistribution(median=3, sigma=0.5, min_len=2, max_len=6)
    requests = synthetic_workload(tokenizer, 4, prompts, outputs, seed=1)
    levels = plan_levels(requests, tokenizer, sweep_loads([2], [50.0, 100.0], 1), 1, True)
    with fake_openai_server() as server:
        result = measure_round(EndpointConfig(server.base_url, "m"), levels, requests[:1], 30.0)
    assert len(server.prompts) == 1 + 3 * 4
    assert [level_name(p) for p in result["points"]] == ["2 in flight", "50 req/s", "100 req/s"]
    for p in result["points"]:
        assert p["num_completed"] == 4 and p["num_failed"] == 0 and p["output_tok_s"] > 0
        assert p["steal_share"] is None or 0.0 <= p["steal_share"] <= 1.0
