"""The measured points of a server comparison: fixed-concurrency levels and a request-rate
sweep with Poisson arrivals (as vLLM's `benchmark_serving` does), each measured once per
round with the hypervisor's steal recorded, and combined over rounds into medians.

A point is one server's run of one level in one round. Its steal share comes from
/proc/stat around the run; a point with more than `max_steal` of the CPU stolen ran on a
slower machine and is thrown out before the medians (the JSON keeps it, marked). Each metric
of a level is the median over that server's kept rounds.

    level k of a sweep over rates r_0..r_n: Poisson arrivals at r_k per second, seed + k
"""

from __future__ import annotations

import statistics
from typing import Any

from pagedserve.services.cli.loadgen.runner import LoadConfig
from pagedserve.services.cli.loadgen.workload import poisson_arrival_times

METRICS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")


def sweep_loads(concurrency: list[int], rates: list[float], seed: int) -> list[LoadConfig]:
    """The fixed-concurrency levels, then one Poisson level per rate, each with its own seed
    (so that no two rates share a gap sequence scaled)."""
    if any(r <= 0 for r in rates):
        raise ValueError(f"request rates must be > 0, got {rates}")
    loads = [LoadConfig(max_concurrency=c, seed=seed) for c in concurrency]
    base = seed + len(loads)
    return loads + [LoadConfig(request_rate=r, seed=base + k) for k, r in enumerate(rates)]


def arrival_schedule(load: LoadConfig, num_requests: int) -> list[float]:
    """When each request of `load` is sent, in seconds from the level's start."""
    return poisson_arrival_times(num_requests, load.request_rate, load.seed)


def point(summary: dict[str, Any], steal: float | None) -> dict[str, Any]:
    """A run summary (`loadgen.runner.run_load`) as one measured point, without the
    per-request records."""
    rate = summary["request_rate"]
    return {
        "max_concurrency": summary["max_concurrency"],
        "request_rate": None if rate == "inf" else rate,
        "num_completed": summary["num_completed"],
        "num_failed": summary["num_failed"],
        "duration_s": summary["duration_s"],
        "output_tok_s": summary["output_throughput"],
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p99_ms": summary["ttft_ms"]["p99"],
        "tpot_p50_ms": summary["tpot_ms"]["p50"],
        "tpot_p99_ms": summary["tpot_ms"]["p99"],
        "steal_share": steal,
    }


def stolen(p: dict[str, Any], max_steal: float) -> bool:
    """Whether the hypervisor took more than `max_steal` of the CPU during the point (no
    record of steal, as off Linux, counts as none)."""
    return p["steal_share"] is not None and p["steal_share"] > max_steal


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_level(points: list[dict[str, Any]], max_steal: float) -> dict[str, Any]:
    """One level's points over the rounds: the medians of every metric over the rounds
    without steal, and which rounds (1-based) were kept and thrown out."""
    kept = [i for i, p in enumerate(points) if not stolen(p, max_steal)]
    first = points[0]
    level = {
        "max_concurrency": first["max_concurrency"],
        "request_rate": first["request_rate"],
        "rounds_kept": [i + 1 for i in kept],
        "rounds_thrown_out": [i + 1 for i in range(len(points)) if i not in kept],
        "num_failed": sum(p["num_failed"] for p in points),
    }
    for metric in METRICS:
        level[metric] = _median([points[i][metric] for i in kept])
    return level


def median_over_rounds(rounds: list[list[dict[str, Any]]], max_steal: float) -> list[dict]:
    """Per level, `median_level` over every round's point of it (rounds: points by level)."""
    if not rounds:
        raise ValueError("no rounds to take a median of")
    by_level = zip(*rounds, strict=True)
    return [median_level(list(points), max_steal) for points in by_level]


def level_name(level: dict[str, Any]) -> str:
    """'16 in flight' or '0.5 req/s' for a point or a level's medians."""
    if level["max_concurrency"] is not None:
        return f"{level['max_concurrency']} in flight"
    return f"{level['request_rate']:g} req/s"
