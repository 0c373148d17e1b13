"""Prometheus metrics under vLLM's names, so that vLLM's Grafana dashboards carry over.

The per-request metrics are measured here as the tokens arrive (`request_metrics.py`); the
engine gauges and totals are read from the live engines' status records at scrape time
(`engine_metrics.py`). Both carry vLLM's labels, `model_name` and `engine`. Each gateway owns
its registry, so several apps can live in one process (tests) without clashing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from pagedserve.services.gateway.engine_metrics import EngineStatusCollector
from pagedserve.services.gateway.request_metrics import RequestMetrics
from pagedserve.services.gateway.router import RoutingStats
from pagedserve.services.gateway.routing_metrics import RoutingCollector
from pagedserve.shared.status import EngineStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProcessRestartCollector(Collector):
    """`pagedserve serve`'s restarts of its processes, from Redis just before a scrape."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily(
            "pagedserve:process_restarts",
            "Processes restarted by `pagedserve serve` after they died",
            labels=["process"],
        )
        for name, count in sorted(self.counts.items()):
            counter.add_metric([name], count)
        yield counter


class GatewayMetrics:
    """Every metric the gateway exposes; `render()` is the /metrics body."""

    def __init__(
        self, model_name: str, max_model_len: int = 8192, routing: RoutingStats | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        self.routing = RoutingCollector(routing if routing is not None else RoutingStats())
        self.registry.register(self.routing)
        self.engines = EngineStatusCollector(model_name)
        self.registry.register(self.engines)
        self.restarts = ProcessRestartCollector()
        self.registry.register(self.restarts)
        self.requests = RequestMetrics(self.registry, model_name, max_model_len)
        self.model_name = model_name

    def render(
        self, live_engines: list[EngineStatus], process_restarts: dict[str, int] | None = None
    ) -> bytes:
        self.engines.statuses = live_engines
        self.routing.statuses = live_engines
        self.restarts.counts = process_restarts or {}
        return generate_latest(self.registry)
