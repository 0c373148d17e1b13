"""pagedserve against `transformers serve --continuous-batching` (and optionally HF
`generate`): same workload, same streaming client, same run, identical-output check.

Each server is started here, warmed up with requests of the measured fields (fresh words, so
no measured prompt is in a prefix cache), run at every concurrency level in turn and stopped
before the next one starts, so that each has the machine to itself; with `--rounds N` the two
alternate N times and each level reports each server's median round (`server_rounds.py`).
Every level sends the same requests to both servers (a fresh-word copy per level, so that our
prefix cache helps no level). Greedy texts of the first `--num-check` requests are compared
across servers.

The CPU's ISA (lscpu flags, torch's kernel capability, ONEDNN_MAX_CPU_ISA /
ATEN_CPU_CAPABILITY as set for the run) and the load average are recorded with the result.

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.vs_transformers_serve --num-prompts 48 --out benchmarks/results/vs_tf
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_args import add_workload_args, ints, resolved_dtype, workload_args
from benchmarks.e2e_flops import (
    best_rate,
    fraction_of_flop_limit,
    measured_rate,
    model_dims,
    workload_flops,
)
from benchmarks.greedy_check import check_summary, greedy_texts
from benchmarks.machine_info import cpu_ticks, machine_info, steal_share
from benchmarks.server_rounds import format_rounds, merge_rounds, rounds_summary
from benchmarks.steal_guard import StealGuard, run_guarded_levels
from benchmarks.transformers_serve import TransformersServeConfig, TransformersServer
from pagedserve.services.cli.loadgen.runner import (
    Level,
    LoadConfig,
    build_workload,
    plan_levels,
    wait_until_ready,
    warm_up,
    warmup_requests,
    workload_summary,
    write_json,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import BenchRequest
from pagedserve.shared.config import (
    DEFAULT_SPECULATIVE_MAX_NUM_SEQS,
    default_num_speculative_tokens,
)


def measure_server(
    endpoint: EndpointConfig,
    levels: list[Level],
    warmup: list[BenchRequest],
    check: list[BenchRequest],
    guard: StealGuard | None = None,
) -> dict[str, Any]:
    """Warm-up, every level (each again while the hypervisor took too much of the CPU,
    see `steal_guard.py`), then the greedy texts of `check`."""
    asyncio.run(wait_until_ready(endpoint, 120.0))
    result: dict[str, Any] = {"load_before": machine_info()["loadavg"]}
    result["warmup"] = warm_up(endpoint, warmup)
    ticks = cpu_ticks()
    result["runs"] = run_guarded_levels(endpoint, levels, guard)
    result["steal_share"] = steal_share(ticks, cpu_ticks())  # every attempt included
    result["texts"] = greedy_texts(endpoint, check) if check else []
    result["load_after"] = machine_info()["loadavg"]
    return result


def run_pagedserve(args: argparse.Namespace, model_dir: Path, *plan: Any) -> dict[str, Any]:
    from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig

    config = PipelineConfig(model_dir, args.dtype, args.max_num_seqs, worker_threads=args.threads,
                            startup_timeout_s=args.startup_timeout,
                            num_speculative_tokens=args.num_speculative_tokens,
                            speculative_max_num_seqs=args.speculative_max_num_seqs)  # fmt: skip
    log_path = Path(tempfile.gettempdir()) / "pagedserve-vs-tf-pagedserve.log"
    print(f"starting pagedserve (logs: {log_path})", flush=True)
    with log_path.open("w") as log, LocalPipeline(config, log=log) as pipeline:
        endpoint = EndpointConfig(pipeline.base_url, str(model_dir))
        return measure_server(endpoint, *plan)


def run_transformers(args: argparse.Namespace, model_dir: Path, *plan: Any) -> dict[str, Any]:
    config = TransformersServeConfig(model_dir, args.dtype_resolved, threads=args.threads,
                                     max_batch_tokens=args.tf_max_batch_tokens,
                                     startup_timeout_s=args.startup_timeout)  # fmt: skip
    log_path = Path(tempfile.gettempdir()) / "pagedserve-vs-tf-transformers.log"
    print(f"starting transformers serve (logs: {log_path})", flush=True)
    with log_path.open("w") as log, TransformersServer(config, log=log) as server:
        return measure_server(server.endpoint(), *plan)


def level_comparison(
    ours: dict[str, Any], theirs: dict[str, Any], flops: float, flops_per_s: float
) -> dict[str, Any]:
    """One level: throughput ratio, each server's share of the FLOP limit (`flops`: the
    level's useful FLOPs) and both servers' TTFT / TPOT p50 and p99 (ms)."""
    row: dict[str, Any] = {
        "max_concurrency": ours["max_concurrency"],
        "pagedserve_tok_s": ours["output_throughput"],
        "transformers_tok_s": theirs["output_throughput"],
        "speedup": ours["output_throughput"] / theirs["output_throughput"],
        "pagedserve_flop_fraction": fraction_of_flop_limit(flops, ours["duration_s"], flops_per_s),
        "transformers_flop_fraction": fraction_of_flop_limit(
            flops, theirs["duration_s"], flops_per_s
        ),
    }
    for metric in ("ttft_ms", "tpot_ms"):
        for q in ("p50", "p99"):
            row[f"{metric}_{q}"] = {
                "pagedserve": ours[metric][q],
                "transformers": theirs[metric][q],
            }
    return row


def compare(
    ours: dict[str, Any], theirs: dict[str, Any], flops: float, flops_per_s: float
) -> list[dict[str, Any]]:
    pairs = zip(ours["runs"], theirs["runs"], strict=True)
    return [level_comparison(a, b, flops, flops_per_s) for a, b in pairs]


HEADER = [
    "| in flight | pagedserve tok/s | transformers tok/s | ratio | % of FLOP limit (ours / theirs) "
    "| TTFT p50 ms (ours / theirs) | TTFT p99 | TPOT p50 | TPOT p99 |",
    "|---|---|---|---|---|---|---|---|---|",
]


def _pair(row: dict[str, Any], key: str) -> str:
    a, b = row[key]["pagedserve"], row[key]["transformers"]
    return "-" if a is None or b is None else f"{a:.0f} / {b:.0f}"


def format_row(r: dict[str, Any]) -> str:
    flop = (
        f"{100 * r['pagedserve_flop_fraction']:.0f} / {100 * r['transformers_flop_fraction']:.0f}"
    )
    return (
        f"| {r['max_concurrency']} | {r['pagedserve_tok_s']:.1f} | {r['transformers_tok_s']:.1f} "
        f"| {r['speedup']:.2f}x | {flop} | {_pair(r, 'ttft_ms_p50')} | {_pair(r, 'ttft_ms_p99')} "
        f"| {_pair(r, 'tpot_ms_p50')} | {_pair(r, 'tpot_ms_p99')} |"
    )


def format_comparison(rows: list[dict[str, Any]], check: dict[str, Any]) -> str:
    lines = [*HEADER, *(format_row(r) for r in rows)]
    lines.append(f"greedy texts identical: {check['num_identical']}/{check['num_requests']}")
    return "\n".join(lines)


def _samples(rate: dict[str, Any]) -> str:
    samples = rate.get("samples_flops_per_s", [])
    if len(samples) < 2:
        return ""
    listed = ", ".join(f"{s / 1e9:.0f}" for s in samples)
    return f" (the best of {len(samples)} measurements, before and after each server: {listed})"


def _speculative(result: dict[str, Any]) -> str:
    tokens, max_seqs = result.get("speculative") or (0, 0)
    if tokens is None:
        return (
            " pagedserve with its default n-gram speculative decoding (on a CPU up to "
            f"{default_num_speculative_tokens('cpu')} draft tokens per sequence) in steps of "
            f"at most {max_seqs} sequences."
        )
    if not tokens:
        return " pagedserve without speculative decoding."
    return (
        f" pagedserve with n-gram speculative decoding: up to {tokens} draft tokens per "
        f"sequence in steps of at most {max_seqs} sequences."
    )


def _steal_lines(result: dict[str, Any]) -> list[str]:
    """The hypervisor's share of the CPU: per kept level where the run recorded it (with the
    attempts set aside for steal), else per server over all its levels."""
    servers = [result.get(s, {}) for s in ("pagedserve", "transformers_serve")]
    per_level = [[r.get("steal_share") for r in s.get("runs", [])] for s in servers]
    if all(shares and None not in shares for shares in per_level):
        ours, theirs = (" / ".join(f"{100 * x:.0f}%" for x in shares) for shares in per_level)
        set_aside = [sum(len(r.get("set_aside", [])) for r in s["runs"]) for s in servers]
        return [
            f"CPU time stolen by the hypervisor during the kept levels: {ours} (pagedserve) "
            f"/ {theirs} (transformers serve); levels measured again for steal: "
            f"{set_aside[0]} (pagedserve) / {set_aside[1]} (transformers serve)"
        ]
    steal = [s.get("steal_share") for s in servers]
    if None in steal:
        return []
    return [
        f"CPU time stolen by the hypervisor during the measured levels: {100 * steal[0]:.0f}% "
        f"(pagedserve) / {100 * steal[1]:.0f}% (transformers serve); compare runs only "
        "where both are low"
    ]


def _hf_steal(hf: dict[str, Any]) -> str:
    if hf.get("steal_share") is None:
        return ""
    again = len(hf.get("set_aside", []))
    return f" ({100 * hf['steal_share']:.0f}% of the CPU stolen; runs set aside: {again})"


def _engine_busy(runs: list[dict[str, Any]]) -> str:
    """How busy pagedserve kept its model at each level (services/cli/loadgen/engine_time.py)."""
    shares = [(r["max_concurrency"], r.get("engine_time")) for r in runs]
    if not shares or any(s is None for _, s in shares):
        return ""
    levels = " / ".join(str(c) for c, _ in shares)

    def pct(key: str) -> str:
        return " / ".join(f"{100 * s[key]:.0f}%" for _, s in shares)

    text = (
        f"pagedserve's model computed for {pct('execute')} of the wall time at {levels} in "
        f"flight (plan out to result in: {pct('in_flight')}; the scheduler between steps: "
        f"{pct('scheduling')})"
    )
    if all(s.get("draft_tokens") for _, s in shares):
        accepted = " / ".join(
            f"{s['accepted_tokens']:.0f} of {s['draft_tokens']:.0f}" for _, s in shares
        )
        text += f"; speculative drafts accepted: {accepted}"
    return text


def report_section(result: dict[str, Any]) -> list[str]:
    """The markdown section of `benchmarks.report_writer` for this benchmark's JSON."""
    m, w, rate = result["machine"], result["workload"], result["matmul_rate"]
    isa = ", ".join(m["isa_flags"]) or "none of note"
    caps = ", ".join(f"{k}={v}" for k, v in m["isa_env"].items()) or "none"
    lines = [
        "## pagedserve vs `transformers serve --continuous-batching`",
        "",
        f"{w['num_requests']} requests, {w['total_output_tokens']} output tokens, "
        f"{result['dtype']}, threads {result['threads'] or 'each server default'}. "
        f"CPU: {m['cpu']}, {m['num_cpus']} cores, flags {isa}; ISA caps: {caps}; torch "
        f"kernels: {m['torch_cpu_capability']}. Matmul rate in the same run: "
        f"{rate['flops_per_s'] / 1e9:.0f} GFLOP/s on {rate['threads']} threads{_samples(rate)}."
        f"{_speculative(result)}",
        "",
        format_comparison(result["comparison"], result["greedy_check"]),
    ]
    rounds = format_rounds(result.get("rounds", []))
    if rounds:
        lines.append(rounds)
    lines.extend(_steal_lines(result))
    busy = _engine_busy(result.get("pagedserve", {}).get("runs", []))
    if busy:
        lines.append(busy)
    if "hf_generate" in result:
        hf = result["hf_generate"]
        lines.append(
            f"HF generate (static batches of {hf['batch_size']}): "
            f"{hf['output_throughput']:.1f} tok/s, {100 * hf['flop_fraction']:.0f}% of the FLOP "
            f"limit{_hf_steal(hf)}; **best pagedserve level / HF generate: "
            f"{result['speedup_vs_hf']:.2f}x**"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_transformers_serve",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add = p.add_argument
    add_workload_args(add)
    add("--dtype", default="auto", help="auto | float32 | bfloat16 (both servers)")
    add("--threads", type=int, default=None, help="OMP threads of each server (default: theirs)")
    add("--max-num-seqs", type=int, default=256)
    add(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="pagedserve's n-gram speculative decoding (0: off; default: its own, 3 on CPU)",
    )
    add("--speculative-max-num-seqs", type=int, default=DEFAULT_SPECULATIVE_MAX_NUM_SEQS)
    add("--concurrency", default="16,64", help="levels of requests in flight, comma-separated")
    add("--num-warmups", type=int, default=8)
    add("--num-check", type=int, default=16, help="greedy requests compared across servers")
    add("--tf-max-batch-tokens", type=int, default=512, help="transformers' tokens per step")
    add("--hf-batch-sizes", default="", help="also run HF generate with these batch sizes")
    add(
        "--max-steal",
        type=float,
        default=0.10,
        help="measure a level again while the hypervisor took more than this share of the CPU",
    )
    add("--max-attempts", type=int, default=3, help="runs of a level at most (steal)")
    add(
        "--rounds",
        type=int,
        default=1,
        help="alternate the servers this many times; each level reports its median round",
    )
    add("--startup-timeout", type=float, default=600.0, help="seconds for each server to start")
    add("--out", default="benchmarks/results/vs_transformers_serve")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dtype_resolved = resolved_dtype(args.dtype)
    requests, tokenizer, model_dir = build_workload(workload_args(args))
    loads = [LoadConfig(max_concurrency=c, seed=args.seed) for c in ints(args.concurrency)]
    levels = plan_levels(requests, tokenizer, loads, args.seed, synthetic=True)
    warmup = warmup_requests(requests, tokenizer, args.num_warmups, args.seed + len(loads))
    guard = StealGuard(tokenizer, args.seed, args.max_steal, args.max_attempts)
    plan = (levels, warmup, requests[: args.num_check], guard)
    rates = [measured_rate(args.dtype_resolved, args.threads)]  # and after each server
    flops = workload_flops(model_dims(model_dir), requests)
    result: dict[str, Any] = {
        "machine": machine_info(),
        "dtype": args.dtype_resolved,
        "threads": args.threads,
        # pagedserve's n-gram speculative decoding: drafts per step (0: off), at most seqs
        "speculative": [args.num_speculative_tokens, args.speculative_max_num_seqs],
        "workload": workload_summary(requests),
        "workload_flops": flops,
    }
    ours_rounds, theirs_rounds = alternate_servers(args, model_dir, plan, rates)
    result["rounds"] = rounds_summary(ours_rounds, theirs_rounds)
    result["pagedserve"] = ours = merge_rounds(ours_rounds)
    result["transformers_serve"] = theirs = merge_rounds(theirs_rounds)
    result["matmul_rate"] = rate = best_rate(rates)
    result["comparison"] = rows = compare(ours, theirs, flops, rate["flops_per_s"])
    result["greedy_check"] = check = check_summary(ours.pop("texts"), theirs.pop("texts"))
    print(format_comparison(rows, check), flush=True)
    save(result, Path(args.out))  # the servers' comparison survives a failed HF run
    if args.hf_batch_sizes:
        result["hf_generate"] = hf = guard.measure(lambda _: run_hf(args, requests, model_dir))
        best = max(r["output_throughput"] for r in ours["runs"])
        result["speedup_vs_hf"] = best / hf["output_throughput"]
        hf["flop_fraction"] = fraction_of_flop_limit(flops, hf["duration_s"], rate["flops_per_s"])
        print(f"best pagedserve level / HF generate: {result['speedup_vs_hf']:.2f}x", flush=True)
        save(result, Path(args.out))
    failed = any(r["num_failed"] for s in (ours, theirs) for r in s["runs"])
    return exit_status(failed, len(check["mismatches"]), args.dtype_resolved)


def exit_status(failed: bool, num_mismatches: int, dtype: str) -> int:
    """1 for a failed request, or for a greedy text that differs in float32, where exactness
    is claimed; in bf16 the two servers' kernels differ and near-ties flip (the report still
    counts them), which must not stop the suite before its report."""
    return 1 if failed or (num_mismatches and dtype == "float32") else 0


def alternate_servers(
    args: argparse.Namespace, model_dir: Path, plan: tuple, rates: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`args.rounds` rounds of pagedserve then transformers serve (`server_rounds.py`), the
    matmul rate measured after each server; greedy texts are checked in the first round."""
    levels, warmup, check, guard = plan
    ours, theirs = [], []
    for index in range(args.rounds):
        round_plan = (levels, warmup, check if index == 0 else [], guard)
        if args.rounds > 1:
            print(f"round {index + 1} of {args.rounds}", flush=True)
        ours.append(run_pagedserve(args, model_dir, *round_plan))
        rates.append(measured_rate(args.dtype_resolved, args.threads))
        theirs.append(run_transformers(args, model_dir, *round_plan))
        rates.append(measured_rate(args.dtype_resolved, args.threads))
    return ours, theirs


def save(result: dict[str, Any], out: Path) -> None:
    write_json(result, out.with_suffix(".json"))
    out.with_suffix(".md").write_text("\n".join(report_section(result)) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", flush=True)


def run_hf(args: argparse.Namespace, requests: list[BenchRequest], model_dir: Path) -> dict:
    import torch

    from pagedserve.services.cli.loadgen.hf_baseline import run_hf_baseline

    dtype = getattr(torch, args.dtype_resolved)
    sizes = ints(args.hf_batch_sizes)
    return run_hf_baseline(model_dir, requests, dtype, sizes, threads=args.threads)


if __name__ == "__main__":
    sys.exit(main())
