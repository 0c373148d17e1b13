"""Servers measured in alternating rounds, each level reported from its median round.

On a shared VM the machine itself drifts: a neighbour's memory traffic slows every process
for minutes at a time without showing as stolen CPU. Two servers measured one after the
other can then differ by the machine's mood as much as by their own merit. Run in rounds
(ours, theirs, ours, theirs, ...), each server meets the same stretches of weather, and the
median round of each level (by throughput; its latencies with it) is robust to one bad round.
"""

from __future__ import annotations

from typing import Any


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median output throughput (of an even count, the lower middle one)."""
    if not runs:
        raise ValueError("no runs to take a median of")
    ordered = sorted(runs, key=lambda run: run["output_throughput"])
    return ordered[(len(ordered) - 1) // 2]


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's rounds (results of `measure_server`) as one result: the first round's
    fields (warm-up, greedy texts, steal over its levels), each level's median run."""
    if not rounds:
        raise ValueError("no rounds to merge")
    merged = dict(rounds[0])
    per_level = zip(*(r["runs"] for r in rounds), strict=True)
    merged["runs"] = [median_run(list(level)) for level in per_level]
    return merged


def rounds_summary(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict]:
    """Every round's throughput per level for both servers, in the order they ran."""
    return [
        {
            "levels": [r["max_concurrency"] for r in a["runs"]],
            "pagedserve_tok_s": [r["output_throughput"] for r in a["runs"]],
            "transformers_tok_s": [r["output_throughput"] for r in b["runs"]],
        }
        for a, b in zip(ours, theirs, strict=True)
    ]


def format_rounds(rounds: list[dict[str, Any]]) -> str:
    """One line: each round's tok/s, ours / theirs (ratio), per level; '' for one round."""
    if len(rounds) < 2:
        return ""
    parts = []
    for index, r in enumerate(rounds, 1):
        levels = zip(r["levels"], r["pagedserve_tok_s"], r["transformers_tok_s"], strict=True)
        cells = ", ".join(f"{c}: {a:.1f} / {b:.1f} ({a / b:.2f}x)" for c, a, b in levels)
        parts.append(f"round {index}: {cells}")
    return (
        f"Servers alternated over {len(rounds)} rounds (tok/s, pagedserve / transformers "
        f"serve, by level in flight): {'; '.join(parts)}. The table gives each server's "
        "median round per level."
    )
