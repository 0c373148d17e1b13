"""How busy a pagedserve engine kept its model during one load level: the step-time counters of
`/metrics` (services/scheduler/step_clock.py), read before and after the level, as shares of
the level's wall time. A server without those counters (transformers serve, vLLM) gives None.

    execute     rank 0 computing steps: the model's busy share
    in_flight   plan out -> result in (execute, plus the link and the wake-ups)
    scheduling  the scheduler's work between steps, while the worker waits

and, where speculative decoding ran, how many draft tokens were checked and accepted; with
async scheduling, the share of steps planned before the last one's result.

A reading is taken once two reads `SETTLE_S` apart agree: read at once after a level, the
counters missed its last ~0.4-0.5 s of model time (bf16, 48 requests at 16 and 64 in flight,
scratch script), which the next level then counted as its own (shares above 100%).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.status_sampler import parse_prometheus_gauges
from pagedserve.shared.status import STATUS_INTERVAL_S

T = TypeVar("T")
SETTLE_S = STATUS_INTERVAL_S + 0.2  # the scheduler writes its counters this often
MAX_SETTLE_READS = 6

COUNTERS = {
    "execute": "pagedserve:worker_execute_seconds_total",
    "in_flight": "pagedserve:step_in_flight_seconds_total",
    "scheduling": "pagedserve:scheduling_seconds_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "steps": "vllm:iteration_tokens_total_count",
    "planned_ahead": "pagedserve:steps_planned_ahead_total",
}
SECONDS = ("execute", "in_flight", "scheduling")


def read_until_settled(read: Callable[[], T | None], interval_s: float = SETTLE_S) -> T | None:
    """`read()` once two reads `interval_s` apart agree (the last one read if they never do
    within `MAX_SETTLE_READS`); None as soon as a read gives None."""
    last = read()
    for _ in range(MAX_SETTLE_READS):
        if last is None:
            return None
        time.sleep(interval_s)
        current = read()
        if current == last:
            return current
        last = current
    return last


def read_engine_seconds(
    endpoint: EndpointConfig, settle_s: float = SETTLE_S
) -> dict[str, float] | None:
    """The counters once settled, or None where the server does not expose them (the
    endpoint's key goes along: a gateway may run with --metrics-require-key)."""
    return read_until_settled(lambda: _read_once(endpoint), settle_s)


def _read_once(endpoint: EndpointConfig) -> dict[str, float] | None:
    try:
        response = httpx.get(endpoint.root + "/metrics", headers=endpoint.headers, timeout=10.0)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    values = parse_prometheus_gauges(response.text, tuple(COUNTERS.values()))
    if any(COUNTERS[key] not in values for key in SECONDS):
        return None
    # the speculation counters show only while an engine speculates (as vLLM's): else 0
    return {key: values.get(name, 0.0) for key, name in COUNTERS.items()}


def engine_time_shares(
    before: dict[str, float] | None, after: dict[str, float] | None, wall_s: float
) -> dict[str, float] | None:
    """Each time counter's growth over the level as a share of its wall time; the draft
    counters' growth as counts."""
    if before is None or after is None or wall_s <= 0:
        return None
    grown = {key: after[key] - before[key] for key in COUNTERS}
    return {key: grown[key] / wall_s if key in SECONDS else grown[key] for key in COUNTERS}


def format_shares(shares: dict[str, float] | None) -> str:
    if shares is None:
        return ""
    text = (
        f", model busy {100 * shares['execute']:.0f}% of the wall time (in flight "
        f"{100 * shares['in_flight']:.0f}%, scheduling {100 * shares['scheduling']:.0f}%)"
    )
    if shares.get("planned_ahead") and shares.get("steps"):
        text += f", {100 * shares['planned_ahead'] / shares['steps']:.0f}% of steps planned ahead"
    drafts = shares["draft_tokens"]
    if drafts:
        accepted = shares["accepted_tokens"]
        text += f", drafts accepted {accepted:.0f} of {drafts:.0f} ({100 * accepted / drafts:.0f}%)"
    return text
