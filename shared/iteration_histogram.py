"""Tokens per engine step, as a cumulative histogram the engine publishes in its status record
and the gateway exposes as vLLM's `vllm:iteration_tokens_total`.

Carried as one readable string field: the cumulative count at each bucket bound, then the
total count and the sum, comma-separated (plain text, like every status field).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from pagedserve.shared.metric_buckets import ITERATION_TOKENS_BUCKETS

ITERATION_TOKEN_BUCKETS = ITERATION_TOKENS_BUCKETS


@dataclass(slots=True)
class IterationHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(ITERATION_TOKEN_BUCKETS))
    num: int = 0
    total: int = 0

    def observe(self, num_tokens: int) -> None:
        index = bisect_left(ITERATION_TOKEN_BUCKETS, num_tokens)  # first bound >= num_tokens
        if index < len(self.counts):
            self.counts[index] += 1
        self.num += 1
        self.total += num_tokens

    def encode(self) -> str:
        cumulative, running = [], 0
        for count in self.counts:
            running += count
            cumulative.append(running)
        return ",".join(str(v) for v in (*cumulative, self.num, self.total))


def decode_cumulative(text: str) -> tuple[list[int], int, int] | None:
    """(cumulative counts per bound, count, sum), or None for an empty or foreign field."""
    try:
        values = [int(v) for v in text.split(",")] if text else []
    except ValueError:
        return None
    if len(values) != len(ITERATION_TOKEN_BUCKETS) + 2:
        return None
    return values[:-2], values[-2], values[-1]
