"""PNG plots of a `pagedserve bench` result (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _label(run: dict[str, Any]) -> str:
    if run.get("max_concurrency"):
        return f"concurrency {run['max_concurrency']}"
    return f"rate {run.get('request_rate', 'inf')}"


def plot_throughput(result: dict[str, Any], path: Path) -> Path | None:
    """Output tok/s per concurrency level, with the HF baseline as a line."""
    runs = [r for r in result["runs"] if r.get("max_concurrency")]
    if len(runs) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["max_concurrency"] for r in runs]
    ax.plot(xs, [r["output_throughput"] for r in runs], "o-", label=result.get("label", "server"))
    hf = result.get("hf_baseline")
    if hf:
        ax.axhline(
            hf["output_throughput"], color="gray", linestyle="--",
            label=f"HF generate (static batch {hf['batch_size']})",
        )  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("max concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency_cdfs(result: dict[str, Any], path: Path) -> Path:
    """CDFs of TTFT, TPOT and E2E latency per run."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    metrics = (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E latency (s)"))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        for run in result["runs"]:
            values = sorted(r[key] for r in run["records"] if r[key] is not None and not r["error"])
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=_label(run))
        ax.set_xlabel(title)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_engine_status(result: dict[str, Any], path: Path) -> Path | None:
    """KV usage and running-batch size over time, from the sampled engine status."""
    runs = [r for r in result["runs"] if r.get("status_samples")]
    if not runs:
        return None
    fig, (ax_kv, ax_run) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for run in runs:
        samples = run["status_samples"]
        ts = [s["time_s"] for s in samples]
        ax_kv.plot(ts, [100 * s["kv_usage"] for s in samples], label=_label(run))
        ax_run.plot(ts, [s["num_running"] for s in samples], label=_label(run))
    ax_kv.set_ylabel("KV blocks in use (%)")
    ax_run.set_ylabel("running sequences")
    ax_run.set_xlabel("seconds since the run started")
    ax_kv.grid(alpha=0.3)
    ax_run.grid(alpha=0.3)
    ax_kv.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(result: dict[str, Any], prefix: Path) -> list[Path]:
    """Every plot that the result has data for, as `<prefix>_<kind>.png`."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    made = [
        plot_throughput(result, Path(f"{prefix}_throughput.png")),
        plot_latency_cdfs(result, Path(f"{prefix}_latency_cdf.png")),
        plot_engine_status(result, Path(f"{prefix}_engine_status.png")),
    ]
    return [p for p in made if p is not None]
