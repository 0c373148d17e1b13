"""The status record's metric fields beyond the scheduler's counters: speculative decoding per
draft position and, with `--kv-cache-metrics`, KV block residency."""

from __future__ import annotations

from pagedserve.services.scheduler.scheduler import Scheduler


def metric_fields(scheduler: Scheduler) -> dict[str, int | str]:
    """EngineStatus fields: `num_speculative_tokens` (0: the gateway shows no speculation
    metrics), the accepted drafts at each of its positions, and the residency histograms when
    the engine follows blocks."""
    num_positions = scheduler.config.num_speculative_tokens
    accepted = scheduler.spec_accepted_per_pos
    per_pos = [accepted[p] if p < len(accepted) else 0 for p in range(num_positions)]
    fields: dict[str, int | str] = {
        "num_speculative_tokens": num_positions,
        "spec_accepted_per_pos": ",".join(str(count) for count in per_pos),
    }
    residency = scheduler.kv.pool.residency
    if residency is not None:
        fields.update(residency.status_fields())
    return fields
