"""KV block residency, as vLLM's `--kv-cache-metrics` measures it: a random sample of blocks
followed from allocation to eviction, for how long a block lives, how long it sat unused
before it was evicted, and the gaps between its reuses (prefix-cache hits).

A block is allocated when taken from the free queue for new data, accessed on each prefix-cache
hit, and evicted when taken again for new data (its old KV is gone then). Only evicted blocks
are observed, so a block still in use counts later. The three histograms use vLLM's residency
buckets and travel in the engine's status record (`shared/status_histogram.py`).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field

from pagedserve.shared.metric_buckets import KV_CACHE_RESIDENCY_BUCKETS
from pagedserve.shared.status_histogram import StatusHistogram

MAX_ACCESSES_KEPT = 4  # the last accesses whose gaps an eviction reports (as vLLM)


@dataclass(slots=True)
class _BlockLife:
    born: float  # monotonic seconds
    last_access: float
    accesses: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_ACCESSES_KEPT))


class BlockResidency:
    def __init__(self, sample_rate: float, rng: random.Random | None = None) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"kv_cache_metrics_sample must be in (0, 1], got {sample_rate}")
        self.sample_rate = sample_rate
        self._rng = rng or random.Random()
        self._followed: dict[int, _BlockLife] = {}  # block id -> its life so far
        self.lifetime = StatusHistogram(KV_CACHE_RESIDENCY_BUCKETS)
        self.idle_before_evict = StatusHistogram(KV_CACHE_RESIDENCY_BUCKETS)
        self.reuse_gap = StatusHistogram(KV_CACHE_RESIDENCY_BUCKETS)

    @property
    def num_followed(self) -> int:
        return len(self._followed)

    def allocated(self, block_id: int) -> None:
        if self._rng.random() < self.sample_rate:
            now = time.monotonic()
            self._followed[block_id] = _BlockLife(born=now, last_access=now)

    def accessed(self, block_id: int) -> None:
        life = self._followed.get(block_id)
        if life is not None:
            life.last_access = time.monotonic()
            life.accesses.append(life.last_access)

    def evicted(self, block_id: int) -> None:
        life = self._followed.pop(block_id, None)
        if life is None:
            return
        now = time.monotonic()
        self.lifetime.observe(now - life.born)
        self.idle_before_evict.observe(now - life.last_access)
        accesses = list(life.accesses)
        for earlier, later in itertools.pairwise(accesses):
            self.reuse_gap.observe(later - earlier)

    def reset(self) -> None:
        """The prefix cache was dropped: the followed blocks' lives end unobserved."""
        self._followed.clear()

    def status_fields(self) -> dict[str, str]:
        """The three histograms under their EngineStatus field names."""
        return {
            "kv_block_lifetime": self.lifetime.encode(),
            "kv_block_idle_before_evict": self.idle_before_evict.encode(),
            "kv_block_reuse_gap": self.reuse_gap.encode(),
        }
