"""Where a pagedserve step's time goes during one benchmark level, from the engine's own
counters on /metrics: how many steps ran, how long the model computed each (the worker's
execute), and how long each plan was out beyond that (plan published to result received,
less the execute: the messages both ways, decoding the plan, sending the result, and the
waits for a core on a busy box).

The counters come from the engine's status record, which the scheduler writes every
`STATUS_INTERVAL_S`: a reading is taken once two reads that far apart agree (the engine is
idle before and after a level, so they settle). A server without these counters (vLLM) has
no step clock: None.
"""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.services.cli.loadgen.engine_time import SETTLE_S, read_until_settled

COUNTERS = {  # field -> the sample /metrics shows, summed over its labels
    "steps": "vllm:iteration_tokens_total_count",
    "execute_s": "pagedserve:worker_execute_seconds_total",
    "in_flight_s": "pagedserve:step_in_flight_seconds_total",
}


def parse_counters(text: str) -> dict[str, float] | None:
    """The `COUNTERS` in a Prometheus text page, or None when one is missing."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    if any(name not in sums for name in COUNTERS.values()):
        return None
    return {field: sums[name] for field, name in COUNTERS.items()}


def read_counters(root_url: str) -> dict[str, float] | None:
    try:
        response = httpx.get(f"{root_url}/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    return parse_counters(response.text) if response.status_code == 200 else None


def read_settled(root_url: str, interval_s: float = SETTLE_S) -> dict | None:
    """The counters once two reads `interval_s` apart agree (`read_until_settled`); None for
    a server without them."""
    return read_until_settled(lambda: read_counters(root_url), interval_s)


def step_clock(
    before: dict[str, float] | None, after: dict[str, float] | None, wall_s: float
) -> dict[str, Any] | None:
    """Per step over a level that lasted `wall_s`: the model's execute and the rest of the
    time its plan was out, in ms, and the share of the wall the model computed."""
    if before is None or after is None:
        return None
    delta = {field: after[field] - before[field] for field in COUNTERS}
    steps = delta["steps"]
    if steps <= 0 or wall_s <= 0:
        return None
    return {
        "steps": int(steps),
        "execute_ms_per_step": 1e3 * delta["execute_s"] / steps,
        "outside_execute_ms_per_step": 1e3 * (delta["in_flight_s"] - delta["execute_s"]) / steps,
        "execute_share": delta["execute_s"] / wall_s,
    }
