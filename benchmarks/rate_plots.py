"""Throughput and p99 TTFT / TPOT against the request rate, one line per server, from the
rate levels of a comparison's medians (`rate_sweep.median_over_rounds`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PANELS = (
    ("output_tok_s", "output tok/s"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p99_ms", "TPOT p99 (ms)"),
)


def rate_series(levels: list[dict[str, Any]], metric: str) -> tuple[list[float], list[float]]:
    """(rates, values) of the rate levels whose median exists (some round was kept)."""
    pairs = [
        (lvl["request_rate"], lvl[metric])
        for lvl in levels
        if lvl["request_rate"] is not None and lvl[metric] is not None
    ]
    return [r for r, _ in sorted(pairs)], [v for _, v in sorted(pairs)]


def write_rate_plots(servers: dict[str, list[dict[str, Any]]], path: Path, title: str) -> Path:
    """One PNG at `path` with a panel per metric of PANELS; `servers`: name -> medians."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(rate_series(levels, "output_tok_s")[0] for levels in servers.values()):
        raise ValueError("no rate level with a kept round to plot")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        for name, levels in servers.items():
            rates, values = rate_series(levels, metric)
            ax.plot(rates, values, marker="o", label=name)
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
