"""How busy a pagedserve engine kept its model during one load level: the step-time counters of
`/metrics` (services/scheduler/step_clock.py), read before and after the level, as shares of
the level's wall time. A server without those counters (transformers serve, vLLM) gives None.

    execute     rank 0 computing steps: the model's busy share
    in_flight   plan out -> result in (execute, plus the link and the wake-ups)
    scheduling  the scheduler's work between steps, while the worker waits

and, where speculative decoding ran, how many draft tokens were checked and accepted; with
async scheduling, the share of steps planned before the last one's result.
"""

from __future__ import annotations

import httpx

from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.status_sampler import parse_prometheus_gauges

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


def read_engine_seconds(endpoint: EndpointConfig) -> dict[str, float] | None:
    """The counters now, or None where the server does not expose them (the endpoint's key
    goes along: a gateway may run with --metrics-require-key)."""
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
