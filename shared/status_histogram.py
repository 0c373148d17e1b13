"""A histogram an engine keeps and publishes in its status record, for the gateway to expose
as a `vllm:` histogram (KV block residency; tokens per step is `iteration_histogram.py`).

Carried as one readable string field: the cumulative count at each bucket bound, then the
total count and the sum, comma-separated (plain text, like every status field).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class StatusHistogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    num: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        index = bisect_left(self.bounds, value)  # the first bound >= value (Prometheus' le)
        if index < len(self.counts):
            self.counts[index] += 1
        self.num += 1
        self.total += value

    def encode(self) -> str:
        cumulative, running = [], 0
        for count in self.counts:
            running += count
            cumulative.append(running)
        return ",".join([*(str(c) for c in cumulative), str(self.num), repr(self.total)])


def decode_histogram(text: str, bounds: Sequence[float]) -> tuple[list[int], int, float] | None:
    """(cumulative counts per bound, count, sum), or None for an empty or foreign field."""
    parts = text.split(",") if text else []
    if len(parts) != len(bounds) + 2:
        return None
    try:
        return [int(p) for p in parts[:-2]], int(parts[-2]), float(parts[-1])
    except ValueError:
        return None
