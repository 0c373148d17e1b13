"""What `benchmarks.device_check` reports: each step's headline figures, read back from the
files the step wrote, and the summary table (printed, and written as summary.md and
summary.json)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

DECODE_GOAL = 0.70  # of the copy bandwidth: decode b64 ctx2048 hd128
DECODE_CASE = "decode b64 ctx2048"
MIXED_CASE = "mixed 1x1792 prefill + 256 decodes"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def oracle_headline(out_dir: Path) -> str:
    try:
        suite = ElementTree.parse(out_dir / "kernel_oracle.xml").getroot()
    except (OSError, ElementTree.ParseError):
        return "no test report"
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (
        f"{passed}/{counts['tests']} passed, {counts['failures'] + counts['errors']} failed, "
        f"{counts['skipped']} skipped"
    )


def kernel_bench_headline(out_dir: Path) -> str:
    data = next((_read_json(p) for p in sorted(out_dir.glob("kernels_*.json"))), None)
    if data is None:
        return "no kernels_*.json"
    cases = data["cases"]
    parts = [
        f"{c['dtype']} decode b64 ctx2048 {100 * c['fraction_of_copy']:.0f}% of copy "
        f"({'meets' if c['fraction_of_copy'] >= DECODE_GOAL else 'below'} the "
        f"{100 * DECODE_GOAL:.0f}% goal)"
        for c in cases
        if c["name"] == DECODE_CASE
    ]
    grids = {c["prefill_grid"]: c["median_us"] for c in cases if c["name"].startswith(MIXED_CASE)}
    if {"flat", "padded"} <= grids.keys():
        parts.append(
            f"mixed 1792+256: flat grid {grids['flat']:.0f} us vs padded {grids['padded']:.0f} "
            f"us ({grids['padded'] / grids['flat']:.2f}x)"
        )
    failed = [c["name"] for c in cases if not c["ok"]]
    parts.append(f"wrong results: {', '.join(failed)}" if failed else "all results correct")
    return "; ".join(parts)


def parity_headline(out_dir: Path) -> str:
    data = _read_json(out_dir / "engine_parity.json")
    if data is None:
        return "no engine_parity.json"
    n = data["num_prompts"]
    return (
        f"fp32: {data['fp32_prompts_agreeing']}/{n} prompts agree on {data['num_tokens']} "
        f"tokens; bf16: {data['bf16_prompts_agreeing']}/{n} agree, max |d logprob| "
        f"{data['bf16_max_logprob_diff']:.3f} (tolerance {data['bf16_logprob_atol']})"
    )


def serve_bench_headline(out_dir: Path) -> str:
    data = _read_json(out_dir / "serve_bench.json")
    if data is None:
        return "no serve_bench.json"
    best = max(data["runs"], key=lambda r: r["output_throughput"])
    text = f"serve {best['output_throughput']:.0f} out tok/s"
    hf = data.get("hf_baseline")
    if hf:
        text += (
            f", HF generate {hf['output_throughput']:.0f} out tok/s (batch {hf['batch_size']}, "
            f"{hf['dtype']}): {data['speedup_vs_hf']:.2f}x"
        )
    return text


HEADLINES = {
    "kernel_oracle": oracle_headline,
    "kernel_bench": kernel_bench_headline,
    "engine_parity": parity_headline,
    "serve_bench": serve_bench_headline,
}


def headline(step_name: str, out_dir: Path) -> str:
    reader = HEADLINES.get(step_name)
    return reader(out_dir) if reader else ""


def summary_markdown(outcomes: list[Any], device_name: str, commit: str) -> str:
    lines = [
        f"# device-check on {device_name} at {commit}",
        "",
        "| step | status | seconds | figures |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.detail} |")
    return "\n".join(lines) + "\n"
