from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.cli.loadgen.status_sampler import StatusSampler, parse_prometheus_gauges

METRICS = """\
# HELP vllm:num_requests_running Running on engines
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_running{model_name="other"} 2.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:num_requests_running_total 99
"""


def test_prometheus_gauges_are_summed_by_exact_name() -> None:
    names = ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:missing")
    assert parse_prometheus_gauges(METRICS, names) == {
        "vllm:num_requests_running": 5.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }


def test_a_sampler_without_a_source_samples_nothing() -> None:
    async def scenario() -> list:
        sampler = StatusSampler()
        sampler.start(0.0)
        await asyncio.sleep(0.01)
        return await sampler.stop()

    assert asyncio.run(scenario()) == []


def test_an_unreachable_source_is_survived() -> None:
    async def scenario() -> list:
        sampler = StatusSampler(metrics_url="http://127.0.0.1:9/metrics", interval_s=0.01)
        sampler.start(0.0)
        await asyncio.sleep(0.05)
        return await sampler.stop()

    assert asyncio.run(scenario()) == []


@pytest.mark.parametrize("sweep", [[1, 4], [2]])
def test_plots_from_a_result(tmp_path, sweep: list[int]) -> None:
    from pagedserve.services.cli.loadgen.plots import write_plots

    record = {"ttft_s": 0.1, "tpot_s": 0.01, "e2e_s": 0.5, "error": None}
    runs = [
        {"max_concurrency": c, "output_throughput": 10.0 * c, "records": [record] * 3,
         "status_samples": [{"time_s": 0.0, "num_running": c, "num_waiting": 0, "kv_usage": 0.1}]}
        for c in sweep
    ]  # fmt: skip
    result = {"runs": runs, "hf_baseline": {"output_throughput": 5.0, "batch_size": 4}}
    made = write_plots(result, tmp_path / "r")
    names = sorted(p.name for p in made)
    expected = ["r_engine_status.png", "r_latency_cdf.png"]
    if len(sweep) > 1:
        expected.insert(1, "r_throughput.png")  # a sweep needs two levels
    assert names == sorted(expected)
    assert all(p.stat().st_size > 1000 for p in made)
