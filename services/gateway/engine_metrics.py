"""The engine-side `vllm:` metrics, one sample per live engine (label `engine`, its id), from
the status records fetched just before a scrape: gauges, engine counters, tokens per step,
speculative decoding (only when some engine speculates, as vLLM shows it only then) and, with
`--kv-cache-metrics`, KV block residency."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pagedserve.shared.metric_buckets import ITERATION_TOKENS_BUCKETS, KV_CACHE_RESIDENCY_BUCKETS
from pagedserve.shared.status import EngineStatus
from pagedserve.shared.status_histogram import decode_histogram

LABELS = ["model_name", "engine"]
# vLLM's cache tiers; an engine's prefix cache is all on its device
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # ours never sleep
# metric name -> (help, EngineStatus field)
ENGINE_GAUGES = {
    "vllm:num_requests_running": ("Requests in model execution batches", "num_running"),
    "vllm:num_requests_waiting": ("Requests waiting to be processed", "num_waiting"),
    "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent usage", "kv_usage"),
}
ENGINE_COUNTERS = {
    "vllm:prefix_cache_queries": (
        "Prompt tokens looked up in the prefix cache",
        "prefix_cache_queries",
    ),
    "vllm:prefix_cache_hits": ("Prompt tokens found in the prefix cache", "prefix_cache_hits"),
    "vllm:num_preemptions": ("Preemptions", "num_preemptions"),
    "pagedserve:worker_execute_seconds": (
        "Seconds the model computed steps (rank 0)",
        "worker_execute_s",
    ),
    "pagedserve:step_in_flight_seconds": (
        "Seconds from each plan out to its result in",
        "step_in_flight_s",
    ),
    "pagedserve:scheduling_seconds": (
        "Seconds the schedulers worked between steps",
        "scheduling_s",
    ),
    "pagedserve:steps_planned_ahead": (
        "Steps planned before the last step's result (async scheduling)",
        "steps_planned_ahead",
    ),
}
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": ("Sequence-steps with speculative drafts", "spec_num_drafts"),
    "vllm:spec_decode_num_draft_tokens": ("Draft tokens checked", "spec_num_draft_tokens"),
    "vllm:spec_decode_num_accepted_tokens": ("Draft tokens accepted", "spec_num_accepted_tokens"),
}
# --kv-cache-metrics: metric name -> (help, EngineStatus field)
RESIDENCY_HISTOGRAMS = {
    "vllm:kv_block_lifetime_seconds": (
        "Sampled KV blocks' time from allocation to eviction",
        "kv_block_lifetime",
    ),
    "vllm:kv_block_idle_before_evict_seconds": (
        "Sampled KV blocks' idle time before eviction",
        "kv_block_idle_before_evict",
    ),
    "vllm:kv_block_reuse_gap_seconds": (
        "Gaps between a sampled KV block's last accesses",
        "kv_block_reuse_gap",
    ),
}


class EngineStatusCollector(Collector):
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.statuses: list[EngineStatus] = []

    def collect(self) -> Iterator[Metric]:
        yield from self._gauges()
        for name, (doc, field) in ENGINE_COUNTERS.items():
            yield self._per_engine(CounterMetricFamily(name, doc, labels=LABELS), field)
        yield self._cached_by_source()
        yield self._histogram(
            "vllm:iteration_tokens_total",
            "Tokens per engine step",
            "iteration_tokens",
            ITERATION_TOKENS_BUCKETS,
            self.statuses,
        )
        yield from self._speculation()
        followed = [s for s in self.statuses if s.kv_block_lifetime]
        if followed:
            for name, (doc, field) in RESIDENCY_HISTOGRAMS.items():
                yield self._histogram(name, doc, field, KV_CACHE_RESIDENCY_BUCKETS, followed)
        yield self._cache_config_info()

    def _values(self, status: EngineStatus) -> list[str]:
        return [self.model_name, status.engine_id]

    def _per_engine(self, family: Metric, field: str, statuses: Sequence[EngineStatus] = ()):
        for status in statuses or self.statuses:
            family.add_metric(self._values(status), getattr(status, field))
        return family

    def _gauges(self) -> Iterator[Metric]:
        for name, (doc, field) in ENGINE_GAUGES.items():
            yield self._per_engine(GaugeMetricFamily(name, doc, labels=LABELS), field)
        live = GaugeMetricFamily(
            "pagedserve:num_engines_live", "Engines with a fresh status and live workers"
        )
        live.add_metric([], len(self.statuses))
        yield live
        # vLLM splits waiting requests by why they wait; ours wait only for capacity (no
        # request is deferred, e.g. for a grammar: grammars compile while it runs)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by reason",
            labels=[*LABELS, "reason"],
        )
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state (ours are always awake)",
            labels=[*LABELS, "sleep_state"],
        )
        for status in self.statuses:
            by_reason.add_metric([*self._values(status), "capacity"], status.num_waiting)
            by_reason.add_metric([*self._values(status), "deferred"], 0)
            for state in SLEEP_STATES:
                sleep.add_metric([*self._values(status), state], float(state == "awake"))
        yield by_reason
        yield sleep

    def _cached_by_source(self) -> Metric:
        family = CounterMetricFamily(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them",
            labels=[*LABELS, "source"],
        )
        for status in self.statuses:
            for source in CACHE_HIT_SOURCES:
                hits = status.prefix_cache_hits if source == "device" else 0
                family.add_metric([*self._values(status), source], hits)
        return family

    def _speculation(self) -> Iterator[Metric]:
        speculating = [s for s in self.statuses if s.num_speculative_tokens > 0]
        if not speculating:
            return
        for name, (doc, field) in SPEC_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=LABELS)
            yield self._per_engine(family, field, speculating)
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position",
            labels=[*LABELS, "position"],
        )
        for status in speculating:
            counts = [int(c) for c in status.spec_accepted_per_pos.split(",") if c]
            for position in range(status.num_speculative_tokens):
                count = counts[position] if position < len(counts) else 0
                per_pos.add_metric([*self._values(status), str(position)], count)
        yield per_pos

    def _histogram(
        self,
        name: str,
        doc: str,
        field: str,
        bounds: Sequence[float],
        statuses: Sequence[EngineStatus],
    ) -> Metric:
        family = HistogramMetricFamily(name, doc, labels=LABELS)
        for status in statuses:
            decoded = decode_histogram(getattr(status, field), bounds)
            if decoded is None:
                continue
            cumulative, count, total = decoded
            buckets = [(str(float(b)), c) for b, c in zip(bounds, cumulative, strict=True)]
            family.add_metric(self._values(status), [*buckets, ("+Inf", count)], total)
        return family

    def _cache_config_info(self) -> Metric:
        """vLLM's info gauge: the KV cache's shape, one sample per live engine."""
        labels = ["engine", "block_size", "num_gpu_blocks"]
        gauge = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration", labels=labels)
        for s in self.statuses:
            gauge.add_metric([s.engine_id, str(s.block_size), str(s.num_total_blocks)], 1.0)
        return gauge
