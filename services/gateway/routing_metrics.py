"""/metrics for routing: this gateway's decisions per engine and reason, the prompt tokens it
expected each chosen engine to hold, and each live engine's actual prefix-cache hits."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedserve.services.gateway.router import RoutingStats
from pagedserve.shared.status import EngineStatus


class RoutingCollector(Collector):
    def __init__(self, stats: RoutingStats) -> None:
        self.stats = stats
        self.statuses: list[EngineStatus] = []  # the live engines, set before each scrape

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "pagedserve:routing_decisions",
            "Requests this gateway routed, by engine ('shared': the shared stream) and reason "
            "(cache_hit, least_loaded, shared)",
            labels=["engine", "reason"],
        )
        for (engine, reason), count in sorted(self.stats.decisions.items()):
            decisions.add_metric([engine, reason], count)
        yield decisions
        expected = CounterMetricFamily(
            "pagedserve:routing_expected_hit_tokens",
            "Prompt tokens the chosen engine was expected to hold in its prefix cache",
            labels=["engine"],
        )
        for engine, tokens in sorted(self.stats.hit_tokens.items()):
            expected.add_metric([engine], tokens)
        yield expected
        hits = CounterMetricFamily(
            "pagedserve:engine_prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache, per live engine (its own count)",
            labels=["engine"],
        )
        for status in self.statuses:
            hits.add_metric([status.engine_id], status.prefix_cache_hits)
        yield hits
