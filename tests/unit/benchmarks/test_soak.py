"""`benchmarks/soak.py`'s reading of its samples: growth per process, and a process that died
during the run reported as such (its RSS had made the report fail)."""

from __future__ import annotations

from benchmarks.soak import growth, metric


def sample(t: float, **rss: float | None) -> dict:
    return {"t_s": t, "rss_mib": rss, "redis_used_mib": 1.0, "redis_keys": 1}


def test_growth_from_warm_up_to_the_median_of_the_last_three() -> None:
    samples = [sample(t, gateway=400.0 + t) for t in range(6)]
    g = growth(samples, 1, 2000)["gateway"]
    assert (g["warm_mib"], g["end_mib"], g["growth_mib"]) == (401.0, 404.0, 3.0)
    assert g["per_1000_requests_mib"] == 1.5


def test_a_process_gone_since_warm_up_is_reported_died() -> None:
    samples = [sample(0, worker=2000.0, gateway=400.0), sample(1, worker=None, gateway=401.0),
               sample(2, worker=None, gateway=402.0)]  # fmt: skip
    result = growth(samples, 0, 10)
    assert result["worker"] == {"died": True}
    assert result["gateway"]["growth_mib"] == 1.0  # the median of the last three: 401


def test_metric_sums_a_familys_samples() -> None:
    text = 'vllm:num_requests_running{engine="a"} 2.0\nvllm:num_requests_running{engine="b"} 1.0\n'
    assert metric(text, "vllm:num_requests_running") == 3.0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0.0
