"""Prometheus metrics under vLLM's names, so that vLLM's Grafana dashboards carry over.

Latency histograms and token counters are measured here, per request; the engine gauges and
totals (running, waiting, KV usage, prefix cache, preemptions) are summed over the live
engines' status records at scrape time. Each gateway owns its registry, so several apps can
live in one process (tests) without clashing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pagedserve.services.gateway.router import RoutingStats
from pagedserve.services.gateway.routing_metrics import RoutingCollector
from pagedserve.shared.iteration_histogram import ITERATION_TOKEN_BUCKETS, decode_cumulative
from pagedserve.shared.status import EngineStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    bounds, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return tuple(bounds)
            bounds.append(step * scale)
        scale *= 10


# Engine totals summed over the live engines: metric name -> (help, EngineStatus field)
ENGINE_COUNTERS = {
    "vllm:prefix_cache_queries": ("Prompt tokens looked up in the prefix cache",
                                  "prefix_cache_queries"),
    "vllm:prefix_cache_hits": ("Prompt tokens found in the prefix cache", "prefix_cache_hits"),
    "vllm:num_preemptions": ("Preemptions", "num_preemptions"),
    "vllm:spec_decode_num_drafts": ("Sequence-steps with speculative drafts", "spec_num_drafts"),
    "vllm:spec_decode_num_draft_tokens": ("Draft tokens checked", "spec_num_draft_tokens"),
    "vllm:spec_decode_num_accepted_tokens": ("Draft tokens accepted",
                                             "spec_num_accepted_tokens"),
    "pagedserve:worker_execute_seconds": ("Seconds the model computed steps (rank 0)",
                                          "worker_execute_s"),
    "pagedserve:step_in_flight_seconds": ("Seconds from each plan out to its result in",
                                          "step_in_flight_s"),
    "pagedserve:scheduling_seconds": ("Seconds the schedulers worked between steps",
                                      "scheduling_s"),
}  # fmt: skip


class EngineStatusCollector(Collector):
    """Engine-side numbers, from the status records fetched just before a scrape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.statuses: list[EngineStatus] = []

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name"]
        values = [self.model_name]
        s = self.statuses
        gauges = {
            "vllm:num_requests_running": ("Running on engines", sum(x.num_running for x in s)),
            "vllm:num_requests_waiting": ("Waiting on engines", sum(x.num_waiting for x in s)),
            "vllm:kv_cache_usage_perc": (
                "KV cache usage (0-1), mean over engines",
                sum(x.kv_usage for x in s) / len(s) if s else 0.0,
            ),
            "vllm:num_engines_live": ("Engines with a fresh status and live workers", len(s)),
        }  # fmt: skip
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        # vLLM splits waiting requests by why they wait; ours wait only for capacity (no
        # request is deferred, e.g. for a grammar: grammars compile while it runs)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by reason",
            labels=[*labels, "reason"],
        )
        by_reason.add_metric([*values, "capacity"], sum(x.num_waiting for x in s))
        by_reason.add_metric([*values, "deferred"], 0)
        yield by_reason
        for name, (doc, field) in ENGINE_COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, sum(getattr(x, field) for x in s))
            yield counter
        yield self._iteration_tokens(labels, values)
        yield self._cache_config_info()

    def _iteration_tokens(self, labels: list[str], values: list[str]) -> Metric:
        """Tokens per engine step, summed over the live engines' histograms."""
        cumulative = [0] * len(ITERATION_TOKEN_BUCKETS)
        count = total = 0
        for status in self.statuses:
            decoded = decode_cumulative(status.iteration_tokens)
            if decoded is None:
                continue
            cumulative = [a + b for a, b in zip(cumulative, decoded[0], strict=True)]
            count, total = count + decoded[1], total + decoded[2]
        buckets = [
            (str(float(b)), c) for b, c in zip(ITERATION_TOKEN_BUCKETS, cumulative, strict=True)
        ]
        family = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Tokens per engine step", labels=labels
        )
        family.add_metric(values, [*buckets, ("+Inf", count)], sum_value=total)
        return family

    def _cache_config_info(self) -> Metric:
        """vLLM's info gauge: the KV cache's shape, one sample per live engine."""
        labels = ["model_name", "engine", "block_size", "num_gpu_blocks"]
        gauge = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration",
                                  labels=labels)  # fmt: skip
        for s in self.statuses:
            values = [self.model_name, s.engine_id, str(s.block_size), str(s.num_total_blocks)]
            gauge.add_metric(values, 1.0)
        return gauge


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
        labels = ["model_name"]
        hist = dict(labelnames=labels, registry=self.registry)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            buckets=LATENCY_BUCKETS,
            **hist,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Time between tokens", buckets=ITL_BUCKETS, **hist
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to finish", buckets=LATENCY_BUCKETS, **hist
        ).labels(model_name)
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled",
            buckets=LATENCY_BUCKETS,
            **hist,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens", labels, registry=self.registry
        ).labels(model_name)
        self.prompt_tokens_cached = Counter(
            "vllm:prompt_tokens_cached", "Prompt tokens served from the prefix cache", labels,
            registry=self.registry,
        ).labels(model_name)  # fmt: skip
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens", labels, registry=self.registry
        ).labels(model_name)
        self._success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.model_name = model_name
        self._add_request_histograms(hist, max_model_len)

    def _add_request_histograms(self, hist: dict, max_model_len: int) -> None:
        """vLLM's per-request histograms: sizes, parameters and where the time went."""
        tokens = buckets_1_2_5(max_model_len)

        def histogram(name: str, doc: str, buckets: tuple) -> Any:
            return Histogram(name, doc, buckets=buckets, **hist).labels(self.model_name)

        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", tokens
        )
        self.request_params_n = histogram("vllm:request_params_n", "The n parameter", N_BUCKETS)
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "The max_tokens parameter", tokens
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "First scheduled to first token", LATENCY_BUCKETS
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "First token to last token", LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds", "First scheduled to last token",
            LATENCY_BUCKETS,
        )  # fmt: skip
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Decode time over the tokens after the first, per request", ITL_BUCKETS,
        )  # fmt: skip
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "The requested max tokens", tokens
        )

    def finished(self, finish_reason: str) -> None:
        self._success.labels(self.model_name, finish_reason).inc()

    def render(
        self, live_engines: list[EngineStatus], process_restarts: dict[str, int] | None = None
    ) -> bytes:
        self.engines.statuses = live_engines
        self.routing.statuses = live_engines
        self.restarts.counts = process_restarts or {}
        return generate_latest(self.registry)
