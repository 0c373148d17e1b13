"""Per-request timing records and the serving metrics computed from them.

Definitions (as vLLM's `benchmark_serving` uses them, so numbers compare):
- TTFT: request sent -> first content chunk received.
- TPOT: (last chunk - first chunk) / (output tokens - 1), per request with >= 2 tokens.
- ITL: the gap between consecutive content chunks (one per token when the server streams
  every token; a chunk holding several tokens counts as one gap).
- E2E latency: request sent -> last byte of the stream.
- Throughput: finished requests and their output tokens over the wall time of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES: tuple[int, ...] = (50, 90, 99)


@dataclass(slots=True)
class RequestRecord:
    """What one request did, in `time.perf_counter()` seconds."""

    prompt_len: int
    expected_output_len: int
    start_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # each content chunk's arrival
    end_time: float = 0.0
    num_output_tokens: int = 0  # from the usage block when sent, else the chunk count
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start_time if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        if len(self.chunk_times) < 1 or self.num_output_tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.num_output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    @property
    def e2e(self) -> float:
        return self.end_time - self.start_time


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default method)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds; None everywhere when there are no values."""
    names = ["mean"] + [f"p{q}" for q in PERCENTILES]
    if not values:
        return dict.fromkeys(names)
    summary: dict[str, float | None] = {"mean": 1000 * sum(values) / len(values)}
    for q in PERCENTILES:
        summary[f"p{q}"] = 1000 * percentile(values, q)
    return summary


def summarize(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The run's metrics: counts, throughput, and latency distributions (ms)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in records if r.ok]
    errors = [r.error for r in records if not r.ok]
    num_output = sum(r.num_output_tokens for r in done)
    num_prompt = sum(r.prompt_len for r in done)
    return {
        "num_requests": len(records),
        "num_completed": len(done),
        "num_failed": len(errors),
        "errors": sorted(set(e for e in errors if e))[:10],
        "num_wrong_length": sum(1 for r in done if r.num_output_tokens != r.expected_output_len),
        "duration_s": duration_s,
        "total_prompt_tokens": num_prompt,
        "total_output_tokens": num_output,
        "request_throughput": len(done) / duration_s,
        "output_throughput": num_output / duration_s,
        "total_token_throughput": (num_prompt + num_output) / duration_s,
        "ttft_ms": distribution([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": distribution([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": distribution([gap for r in done for gap in r.itls]),
        "e2e_ms": distribution([r.e2e for r in done]),
    }
