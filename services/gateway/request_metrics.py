"""vLLM's per-request metrics, measured by the gateway as each choice's tokens arrive and when
it finishes, labelled by model and by the engine that served it (as vLLM labels its engines),
with vLLM 0.32's bucket bounds (`shared/metric_buckets.py`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from pagedserve.shared.metric_buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS,
    REQUEST_PARAMS_N_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    request_tokens_buckets,
)

LABELS = ["model_name", "engine"]
FINISH_REASONS = ("stop", "length", "abort", "error")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# vLLM's queue limits: ours is --max-pending-requests (and the engines' --max-waiting)
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
REQUEST_TYPES = ("chat_completions", "responses", "other")  # vLLM's, for its tool parser


@dataclass(frozen=True, slots=True)
class FinishedChoice:
    engine: str  # the engine id that served it; "" if none did
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generation_tokens: int
    num_preemptions: int
    n: int
    max_tokens: int
    decode_s: float | None  # first token to last; None: no token came


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        self.model_name = model_name
        self._engines: set[str] = set()
        self._token_series: dict[str, tuple[Any, Any]] = {}  # `_series`: labels() once
        self._counters(registry)
        tokens = request_tokens_buckets(max_model_len)
        latency = REQUEST_LATENCY_BUCKETS

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=registry)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token", TIME_TO_FIRST_TOKEN_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between tokens", INTER_TOKEN_LATENCY_BUCKETS
        )
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Decode time over the tokens after the first, per request",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish", latency)
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Arrival to first scheduled", latency
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds", "First scheduled to first token", latency
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds", "First token to last token", latency
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds", "First scheduled to last token", latency
        )
        self.prompt_tokens_hist = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request", tokens
        )
        self.generation_tokens_hist = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request", tokens
        )
        self.params_n = histogram(
            "vllm:request_params_n", "The n parameter", REQUEST_PARAMS_N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "The max_tokens parameter", tokens
        )
        self.max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "The requested max tokens", tokens
        )
        self.num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Times a request was preempted",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Prompt tokens whose KV was computed (not found in the prefix cache)",
            tokens,
        )

    def _counters(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=registry)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens")
        self.prompt_tokens_by_source = counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by source", ("source",)
        )
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens served from the prefix cache"
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens")
        self.success = counter(
            "vllm:request_success", "Finished requests by finish reason", ("finished_reason",)
        )
        self.admission_rejections = Counter(
            "vllm:admission_rejections",
            "Requests refused by a queue limit, by reason",
            ["model_name", "reason"],
            registry=registry,
        )
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(self.model_name, reason)
        self.tool_parser = Counter(
            "vllm:tool_call_parser_invocations",
            "Tool-call parser runs: once per choice, or once per delta when streaming",
            ["model_name", "mode", "outcome", "request_type"],
            registry=registry,
        )
        for mode, outcome, kind in itertools.product(
            ("streaming", "non_streaming"), ("tool_call", "no_tool_call"), REQUEST_TYPES
        ):
            self.tool_parser.labels(self.model_name, mode, outcome, kind)

    def tool_parser_invoked(self, streaming: bool, called: bool) -> None:
        """The Hermes parser read a chat output (ours has no Responses API)."""
        mode = "streaming" if streaming else "non_streaming"
        outcome = "tool_call" if called else "no_tool_call"
        self.tool_parser.labels(self.model_name, mode, outcome, "chat_completions").inc()

    def _values(self, engine: str) -> tuple[str, str]:
        """The label values; an engine's first use creates its zero series, as vLLM has one
        per engine from the start."""
        if engine not in self._engines:
            self._engines.add(engine)
            for reason in FINISH_REASONS:
                self.success.labels(self.model_name, engine, reason)
        return self.model_name, engine

    def _series(self, engine: str) -> tuple[Any, Any]:
        """The engine's (time to first token, inter-token latency) series, looked up once:
        `labels` costs more than the observation, on a path taken for every streamed token."""
        series = self._token_series.get(engine)
        if series is None:
            values = self._values(engine)
            series = (self.ttft.labels(*values), self.itl.labels(*values))
            self._token_series[engine] = series
        return series

    def first_token(self, engine: str, seconds: float) -> None:
        self._series(engine)[0].observe(seconds)

    def token_gap(self, engine: str, seconds: float) -> None:
        self._series(engine)[1].observe(seconds)

    def rejected(self, reason: str = "max_num_queued_reqs") -> None:
        self.admission_rejections.labels(self.model_name, reason).inc()

    def finished(self, engine: str, reason: str) -> None:
        self.success.labels(*self._values(engine), reason).inc()

    def completed(self, choice: FinishedChoice, e2e_s: float) -> None:
        """A choice that finished with its tokens (any reason): sizes, parameters, times."""
        values = self._values(choice.engine)
        computed = choice.num_prompt_tokens - choice.num_cached_tokens
        self.e2e.labels(*values).observe(e2e_s)
        self.prompt_tokens.labels(*values).inc(choice.num_prompt_tokens)
        for source, count in zip(
            PROMPT_SOURCES, (computed, choice.num_cached_tokens, 0), strict=True
        ):
            self.prompt_tokens_by_source.labels(*values, source).inc(count)
        self.prompt_tokens_cached.labels(*values).inc(choice.num_cached_tokens)
        self.generation_tokens.labels(*values).inc(choice.num_generation_tokens)
        self.prompt_tokens_hist.labels(*values).observe(choice.num_prompt_tokens)
        self.generation_tokens_hist.labels(*values).observe(choice.num_generation_tokens)
        self.params_n.labels(*values).observe(choice.n)
        self.params_max_tokens.labels(*values).observe(choice.max_tokens)
        self.max_num_generation_tokens.labels(*values).observe(choice.max_tokens)
        self.num_preemptions.labels(*values).observe(choice.num_preemptions)
        self.prefill_kv_computed.labels(*values).observe(computed)
        if choice.decode_s is not None:
            self.decode_time.labels(*values).observe(choice.decode_s)
            # as vLLM: the first token is the prefill's; fewer than two tokens give 0
            tokens_after_first = choice.num_generation_tokens - 1
            mean = choice.decode_s / tokens_after_first if tokens_after_first > 0 else 0.0
            self.time_per_output_token.labels(*values).observe(mean)

    def engine_times(self, engine: str, queue_s: float, prefill_s: float, inference_s: float):
        """The phases that start when the engine first scheduled the choice."""
        values = self._values(engine)
        self.queue_time.labels(*values).observe(queue_s)
        self.prefill_time.labels(*values).observe(prefill_s)
        self.inference_time.labels(*values).observe(inference_s)
