"""A snapshot of the scheduler, for metrics, the engine hash in Redis and `pagedserve queue`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int  # free ones, cached-but-free included (they are evictable)
    num_total_blocks: int
    kv_usage: float  # 0..1: fraction of blocks held by some request
    prefix_cache_queries: int  # tokens looked up in the prefix cache
    prefix_cache_hits: int  # tokens found there
    num_preemptions: int  # total since start
    num_finished: int  # total since start, any finish reason
    num_aborted: int
    num_steps: int
    spec_num_drafts: int = 0  # sequence-steps that had drafts checked
    spec_num_draft_tokens: int = 0  # drafts checked
    spec_num_accepted_tokens: int = 0  # drafts accepted

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )
