"""Turns the benchmark JSONs under `benchmarks/results/` into one markdown summary.

    python -m benchmarks.report_writer --dir benchmarks/results > benchmarks/results/performance.md

Reads `serve.json` (`pagedserve bench`), `pipeline_overhead.json`, `roofline.json` and
`vs_transformers_serve.json` and `vs_vllm.json`; a file that is missing is skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _freshness_note(result: dict[str, Any]) -> str:
    """How the levels avoided (or not) serving each other's prompts from the prefix cache."""
    warmup = result.get("warmup") or {}
    note = f"{warmup.get('num_requests', 0)} unmeasured warm-up requests first. "
    if all(run.get("fresh_prompts", False) for run in result["runs"]):
        return note + (
            "Each level sends the same lengths with fresh words, so no level hits the prefix "
            "cache with another's prompts; HF runs the first level's requests."
        )
    return note + "Levels repeat the prompts: later ones may hit the prefix cache."


def serve_section(result: dict[str, Any]) -> list[str]:
    w = result["workload"]
    lines = [
        "## End-to-end serving vs HF `generate` (`pagedserve bench`)",
        "",
        f"{w['num_requests']} requests, prompt {w['prompt_len']['min']}-"
        f"{w['prompt_len']['max']} tokens (mean {w['prompt_len']['mean']:.0f}), output "
        f"{w['output_len']['min']}-{w['output_len']['max']} (mean {w['output_len']['mean']:.0f}),"
        f" {w['total_output_tokens']} output tokens; all sent at once, at most N in flight.",
        _freshness_note(result),
        "",
        "| system | req/s | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
        "| ITL p50 ms | E2E p50 / p99 ms | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        t, p, i, e = run["ttft_ms"], run["tpot_ms"], run["itl_ms"], run["e2e_ms"]
        lines.append(
            f"| pagedserve, concurrency {run['max_concurrency'] or 'inf'} "
            f"| {run['request_throughput']:.2f} | {run['output_throughput']:.1f} "
            f"| {_ms(t['p50'])} / {_ms(t['p99'])} | {_ms(p['p50'])} / {_ms(p['p99'])} "
            f"| {_ms(i['p50'])} | {_ms(e['p50'])} / {_ms(e['p99'])} | {run['num_failed']} |"
        )
    hf = result.get("hf_baseline")
    if hf:
        e = hf["e2e_ms"]
        lines.append(
            f"| HF generate, static batches of {hf['batch_size']} "
            f"| {hf['request_throughput']:.2f} | {hf['output_throughput']:.1f} | - | - | - "
            f"| {_ms(e['p50'])} / {_ms(e['p99'])} | 0 |"
        )
        probes = ", ".join(
            f"{p['batch_size']}: {p['output_throughput']:.1f} tok/s" for p in hf["probes"]
        )
        lines += [
            "",
            f"HF probes on the first {hf['probes'][0]['num_requests']} requests ({probes}); "
            f"HF generated {hf['num_generated_tokens']} tokens to deliver "
            f"{hf['total_output_tokens']} (static batches run to their longest request). "
            f"HF threads: {hf.get('num_threads')}, dtype {hf.get('dtype')}.",
            "",
            f"**Best pagedserve level / HF generate: {result['speedup_vs_hf']:.2f}x output "
            "tokens/s.**",
        ]
    return lines


def pipeline_section(result: dict[str, Any]) -> list[str]:
    inproc, pipe, o = result["in_process"], result["pipeline"], result["overhead"]
    kv = inproc["kv_memory"]
    lines = [
        "## Pipeline hops (in-process engine vs HTTP + Redis + ZeroMQ)",
        "",
        "| path | output tok/s | engine steps | ms / step |",
        "|---|---|---|---|",
        f"| in-process `LLMEngine` | {inproc['output_throughput']:.1f} | {inproc['num_steps']} "
        f"| {inproc['step_ms']:.1f} |",
        f"| gateway + Redis + scheduler + worker | {pipe['output_throughput']:.1f} "
        f"| {pipe['num_steps']} | {pipe['step_ms']:.1f} |",
        "",
        "In-process runs before and after the pipeline's: "
        + " and ".join(f"{x:.1f}" for x in inproc.get("runs_output_throughput", []))
        + f" tok/s (spread {100 * inproc.get('noise', 0.0):.1f}%: the machine's noise; the prefix "
        "cache is emptied before each run, so every run computes every prompt).",
        "",
        f"**Hops cost {100 * o['throughput_loss']:.1f}% of throughput** "
        f"({o['extra_ms_per_step']:+.1f} ms per step, {o['extra_ms_per_token']:+.2f} ms per "
        f"output token; threads: in-process {result.get('threads')}, worker "
        f"{result.get('worker_threads')}).",
        "",
        "## KV memory at peak (same in-process run)",
        "",
        f"Peak: step {kv['peak_step']}, {kv['num_running_at_peak']} requests running, "
        f"{kv['num_real_tokens_at_peak']} tokens; the cache holds {kv['total_slots']} slots.",
        "",
        "| scheme | slots holding real tokens | slots / request | requests that fit |",
        "|---|---|---|---|",
    ]
    names = {"paged": f"paged (block {kv['block_size']})",
             "reserve_max_tokens": "reserve prompt + max_tokens",
             "reserve_max_model_len": f"reserve max_model_len ({kv['max_model_len']})"}  # fmt: skip
    for key, label in names.items():
        s = kv[key]
        lines.append(
            f"| {label} | {100 * s['real_token_fraction']:.1f}% | {s['slots_per_request']:.1f} "
            f"| {s['requests_that_fit']} |"
        )
    by_size = kv.get("paged_real_token_fraction_by_block_size")
    if by_size:
        sizes = ", ".join(f"block {k}: {100 * v:.1f}%" for k, v in by_size.items())
        lines += ["", f"Same peak tokens under other page sizes: {sizes}."]
    return lines


def roofline_section(report: dict[str, Any]) -> list[str]:
    rates = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in report["matmul_flops_per_s"].items())
    levels = ", ".join(
        f"B={x['batch_size']}: {x['tokens_per_s']:.0f} tok/s ({x['step_ms']:.0f} ms/step)"
        for x in report["decode_levels"]
    )
    return [
        "## Roofline (in-process decode vs the FLOP limit)",
        "",
        f"- matmul rate measured in the same run ({report.get('num_threads')} threads, 2048^3): "
        f"{rates}",
        f"- model: {report['num_params'] / 1e6:.1f}M parameters; "
        f"{report['flops_per_token'] / 1e6:.0f} MFLOP per token at context "
        f"{report['context_len']:.0f} (2 x matmul parameters + attention)",
        f"- FLOP limit: {report['flop_limit_tokens_per_s']:.0f} tokens/s ({report['dtype']})",
        f"- decode: {levels}",
        f"- **best: {report['best_decode_tokens_per_s']:.0f} tokens/s at batch "
        f"{report['best_batch_size']} = {100 * report['fraction_of_flop_limit']:.0f}% of the "
        "FLOP limit**",
    ]


def build_report(directory: Path) -> str:
    from benchmarks.vs_transformers_serve import report_section as vs_transformers_section
    from benchmarks.vs_vllm_report import report as vs_vllm_report

    sections: list[list[str]] = []
    for name, section in (
        ("serve.json", serve_section),
        ("pipeline_overhead.json", pipeline_section),
        ("roofline.json", roofline_section),
        ("vs_transformers_serve.json", vs_transformers_section),
        ("vs_vllm.json", lambda result: vs_vllm_report(result).split("\n")),
    ):
        path = directory / name
        if path.is_file():
            sections.append(section(json.loads(path.read_text())))
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks.report_writer", description=__doc__)
    p.add_argument("--dir", default="benchmarks/results")
    print(build_report(Path(p.parse_args().dir)), end="")
