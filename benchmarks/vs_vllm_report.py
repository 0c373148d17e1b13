"""The markdown of a `vs_vllm` result: the machine and the peer, one row per level with both
servers' medians, their ratio and the ratio of each round, and the steal of every round."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.rate_sweep import level_name, stolen

HEADER = [
    "| level | pagedserve tok/s | vLLM tok/s | ratio | TTFT p50 ms (ours / vLLM) | TTFT p99 "
    "| TPOT p50 | TPOT p99 | rounds kept (ours / vLLM) | ratio by round |",
    "|---|---|---|---|---|---|---|---|---|---|",
]
OURS, PEER = "pagedserve", "vLLM CPU"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _pair(ours: dict[str, Any], peer: dict[str, Any] | None, metric: str) -> str:
    return f"{_num(ours[metric])} / {_num(peer[metric]) if peer else '-'}"


def round_ratios(result: dict[str, Any], level: int) -> list[float | None]:
    """Our output tok/s over vLLM's at level `level`, round by round (the servers alternate,
    so round i of each ran side by side in time): None where either round's point was thrown
    out for steal or is missing. The median ratio hides how far the rounds spread."""
    rounds = result["rounds"]
    ratios: list[float | None] = []
    for ours, peer in zip(rounds.get(OURS, []), rounds.get(PEER, []), strict=False):
        points = [r.get("points") or [] for r in (ours, peer)]
        if any(len(p) <= level for p in points):
            ratios.append(None)
            continue
        mine, theirs = (p[level] for p in points)
        kept = not any(stolen(p, result["max_steal"]) for p in (mine, theirs))
        ok = kept and mine["output_tok_s"] is not None and theirs["output_tok_s"]
        ratios.append(mine["output_tok_s"] / theirs["output_tok_s"] if ok else None)
    return ratios


def _round_ratios_cell(ratios: Sequence[float | None]) -> str:
    if not any(r is not None for r in ratios):
        return "-"
    return " / ".join("-" if r is None else f"{r:.2f}" for r in ratios) + "x"


def level_row(
    ours: dict[str, Any], peer: dict[str, Any] | None, ratios: Sequence[float | None] = ()
) -> str:
    theirs = peer["output_tok_s"] if peer else None
    kept = f"{len(ours['rounds_kept'])} / {len(peer['rounds_kept']) if peer else '-'}"
    cells = [
        level_name(ours),
        _num(ours["output_tok_s"], 1),
        _num(theirs, 1),
        _ratio(ours["output_tok_s"], theirs),
        *(
            _pair(ours, peer, m)
            for m in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")
        ),
        kept,
        _round_ratios_cell(ratios),
    ]
    return "| " + " | ".join(cells) + " |"


def steal_line(rounds: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for name, server_rounds in rounds.items():
        shares = [r["steal_share"] for r in server_rounds]
        listed = ", ".join("-" if s is None else f"{100 * s:.1f}%" for s in shares)
        parts.append(f"{name}: {listed}")
    return "CPU time stolen by the hypervisor per round: " + "; ".join(parts)


FOOTPRINT_HEADER = [
    "| server | ready s (launch to /health), by round | peak RSS GiB | PSS GiB after the run |",
    "|---|---|---|---|",
]


def footprint_rows(rounds: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One row per server: every round's start-up time (the first may compile or fill a
    cache) and the median of its rounds' peak memory."""
    rows = []
    for name, server_rounds in rounds.items():
        prints = [r["footprint"] for r in server_rounds if "footprint" in r]
        if not prints:
            continue
        ready = ", ".join(_num(p["ready_s"], 1) for p in prints)
        rss = statistics.median(p["peak_rss_gib"] for p in prints)
        pss = statistics.median(p["settled_pss_gib"] for p in prints)
        rows.append(f"| {name} | {ready} | {rss:.2f} | {pss:.2f} |")
    return rows


STEP_CLOCK_HEADER = [
    "| level | steps | model execute ms per step | plan out beyond the execute, ms per step "
    "| model busy share of the wall |",
    "|---|---|---|---|---|",
]


def step_clock_rows(rounds: list[dict[str, Any]]) -> list[str]:
    """pagedserve's step clock per level, medians over the rounds that recorded one."""
    rows = []
    for points in zip(*(r["points"] for r in rounds if r.get("points")), strict=True):
        clocks = [p["step_clock"] for p in points if p.get("step_clock")]
        if not clocks:
            continue
        m = {field: statistics.median(c[field] for c in clocks) for field in clocks[0]}
        rows.append(
            f"| {level_name(points[0])} | {m['steps']:.0f} | {m['execute_ms_per_step']:.1f} | "
            f"{m['outside_execute_ms_per_step']:.2f} | {100 * m['execute_share']:.1f}% |"
        )
    return rows


def machine_line(result: dict[str, Any]) -> str:
    m = result["machine"]
    caps = ", ".join(f"{k}={v}" for k, v in m["isa_env"].items()) or "none"
    return (
        f"CPU: {m['cpu']}, {m['num_cpus']} cores, lscpu flags of note: "
        f"{', '.join(m.get('lscpu_isa_flags') or m['isa_flags']) or 'none'}; ISA caps: {caps}; "
        f"torch kernels: {m['torch_cpu_capability']}. {result['dtype']}, threads "
        f"{result['threads'] or 'each server default'}"
        f"{'; pagedserve with --async-scheduling' if result.get('async_scheduling') else ''}"
        "; load before: "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg'])}."
    )


def peer_line(peer: dict[str, Any] | None) -> str:
    if not peer:
        return "No peer: pagedserve alone (no --vllm-python / $VLLM_PYTHON)."
    return (
        f"Peer: vLLM {peer['vllm']} CPU build (torch {peer['torch']}, kernels "
        f"{peer['torch_cpu_capability']}), {peer['dtype']}, OMP threads bound to "
        f"{peer['omp_bind']}, {peer['kv_cache_gib']} GiB KV cache"
        + (f", started with `{' '.join(peer['extra_args'])}`." if peer.get("extra_args") else ".")
    )


PROMPT_KINDS = {"words": " (prompts of random words)", "prose": " (chat requests about prose)"}


def report(result: dict[str, Any]) -> str:
    w, medians = result["workload"], result["medians"]
    ours, peer = medians[OURS], medians.get(PEER)
    lines = [
        "## pagedserve vs vLLM's CPU build",
        "",
        f"{w['num_requests']} requests per level{PROMPT_KINDS.get(w.get('text', ''), '')}, "
        f"{w['total_output_tokens']} output tokens; "
        f"medians over {len(result['rounds']['pagedserve'])} alternated rounds, a round's "
        f"point thrown out where more than {100 * result['max_steal']:.0f}% of the CPU was "
        "stolen.",
        machine_line(result),
        peer_line(result.get("peer")),
        "",
        *HEADER,
        *(
            level_row(o, p, round_ratios(result, i))
            for i, (o, p) in enumerate(zip(ours, peer or [None] * len(ours), strict=True))
        ),
        "",
        steal_line(result["rounds"]),
        "",
        "Start-up and memory: every process the server runs (pagedserve: Redis, scheduler, "
        "worker, gateway; vLLM: its API server and engine core): RSS summed as `ps` shows it, "
        "sampled every 0.5 s; PSS (shared pages divided among their processes) read once after "
        "the last level.",
        "",
        *FOOTPRINT_HEADER,
        *footprint_rows(result["rounds"]),
        "",
        "pagedserve's steps, from its engine's counters on /metrics (`benchmarks/step_clock.py`): "
        "the model's execute, and how long each plan was out beyond it (messages both ways, "
        "decoding the plan, sending the result, waiting for a core), medians over the rounds.",
        "",
        *STEP_CLOCK_HEADER,
        *step_clock_rows(result["rounds"]["pagedserve"]),
        "",
        f"Command: `{result['command']}`",
    ]
    return "\n".join(lines)
