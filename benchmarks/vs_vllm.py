"""pagedserve against vLLM's CPU build: the suite's workload at fixed concurrency levels
(as against transformers serve) and a request-rate sweep with Poisson arrivals (as vLLM's
serving benchmark), in alternated rounds, medians over the rounds without steal, plots of
throughput and p99 TTFT / TPOT against the rate; and each server's start-up time and peak
memory (`server_footprint.py`) in every round.

The peer is optional: without `--vllm-python` (or $VLLM_PYTHON, the interpreter of the venv
vLLM is installed in) only pagedserve is measured. Each server has the machine to itself:
started, warmed up with fresh words, run at every level, stopped before the other starts.

    VLLM_PYTHON=/work/vllm-venv/bin/python python -m benchmarks.vs_vllm --dtype float32 \\
      --threads 2 --rates 0.5,1,2 --rounds 3 --out benchmarks/results/vs_vllm
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from benchmarks.bench_args import add_workload_args, floats, ints, resolved_dtype, workload_args
from benchmarks.machine_info import ISA_FLAGS, cpu_ticks, machine_info, steal_share
from benchmarks.rate_plots import write_rate_plots
from benchmarks.rate_sweep import median_over_rounds, point, sweep_loads
from benchmarks.server_footprint import ServerFootprint
from benchmarks.step_clock import step_clock
from benchmarks.vllm_serve import VLLM_PYTHON_ENV, VllmServeConfig, VllmServer, peer_info
from benchmarks.vs_vllm_report import OURS, PEER
from pagedserve.services.cli.loadgen.runner import (
    Level,
    build_workload,
    plan_levels,
    run_levels,
    wait_until_ready,
    warm_up,
    warmup_requests,
    workload_summary,
    write_json,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import BenchRequest
from pagedserve.shared.config import DEFAULT_SPECULATIVE_MAX_NUM_SEQS


def lscpu_isa() -> list[str]:
    """The ISA flags of note in `lscpu`'s Flags line ([] where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("Flags:"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in ISA_FLAGS if f in flags]
    return []


def measure_round(
    endpoint: EndpointConfig, levels: list[Level], warmup: list[BenchRequest], timeout_s: float
) -> dict[str, Any]:
    """Warm-up, then every level as one point with the steal during it (`rate_sweep.point`)
    and, for pagedserve, its engine's step clock (`step_clock.py`; None for vLLM)."""
    asyncio.run(wait_until_ready(endpoint, timeout_s))
    result: dict[str, Any] = {"load_before": os.getloadavg(), "warmup": warm_up(endpoint, warmup)}
    start = cpu_ticks()
    points = []
    for level in levels:
        before = cpu_ticks()
        summary = run_levels(endpoint, [level])[0]
        steal = steal_share(before, cpu_ticks())
        clock = step_clock(summary.get("engine_time"), summary["duration_s"])
        points.append(point(summary, steal) | {"step_clock": clock})
    result["steal_share"] = steal_share(start, cpu_ticks())
    result["points"] = points
    return result


def measure_server(
    name: str, start: Callable[[TextIO], Any], endpoint_of: Callable[[Any], EndpointConfig],
    plan: tuple, timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """One round of one server: `start(log)` is its context manager, `endpoint_of(server)`
    where it answers; the round's points with the server's start-up time and memory."""
    log_path = Path(tempfile.gettempdir()) / f"pagedserve-vs-vllm-{name}.log"
    print(f"starting {name} (logs: {log_path})", flush=True)
    with log_path.open("w") as log, ServerFootprint() as footprint, start(log) as server:
        footprint.ready()
        result = measure_round(endpoint_of(server), *plan, timeout_s)
        footprint.settled()
    return result | {"footprint": footprint.summary()}


def run_pagedserve(args: argparse.Namespace, model_dir: Path, *plan: Any) -> dict[str, Any]:
    from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig

    config = PipelineConfig(
        model_dir,
        args.dtype_resolved,
        args.max_num_seqs,
        worker_threads=args.threads,
        startup_timeout_s=args.startup_timeout,
        async_scheduling=args.async_scheduling,
        num_speculative_tokens=args.num_speculative_tokens,
        speculative_max_num_seqs=args.speculative_max_num_seqs,
    )
    return measure_server(
        "pagedserve",
        lambda log: LocalPipeline(config, log=log),
        lambda pipeline: EndpointConfig(pipeline.base_url, str(model_dir)),
        plan,
        args.startup_timeout,
    )


def vllm_config(args: argparse.Namespace, model_dir: Path) -> VllmServeConfig:
    return VllmServeConfig(
        Path(args.vllm_python),
        model_dir,
        args.dtype_resolved,
        args.threads,
        args.vllm_kv_cache_gib,
        args.max_num_seqs,
        args.vllm_startup_timeout,
        args.num_speculative_tokens,
        tuple(shlex.split(args.vllm_args)),
    )


def run_vllm(args: argparse.Namespace, model_dir: Path, *plan: Any) -> dict[str, Any]:
    return measure_server(
        "vllm",
        lambda log: VllmServer(vllm_config(args, model_dir), log=log),
        lambda server: server.endpoint(),
        plan,
        args.startup_timeout,
    )


def alternate_servers(
    args: argparse.Namespace, model_dir: Path, plan: tuple
) -> dict[str, list[dict[str, Any]]]:
    """`args.rounds` rounds of pagedserve then (where given) vLLM: server name -> rounds."""
    rounds: dict[str, list[dict[str, Any]]] = {OURS: []}
    if args.vllm_python:
        rounds[PEER] = []
    for index in range(args.rounds):
        print(f"round {index + 1} of {args.rounds}", flush=True)
        rounds[OURS].append(run_pagedserve(args, model_dir, *plan))
        if args.vllm_python:
            rounds[PEER].append(run_vllm(args, model_dir, *plan))
    return rounds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_vllm",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add = p.add_argument
    add_workload_args(add)
    add(
        "--vllm-python",
        default=os.environ.get(VLLM_PYTHON_ENV),
        help=f"python of vLLM's venv (default ${VLLM_PYTHON_ENV}); none: pagedserve alone",
    )
    add("--dtype", default="auto", help="auto | float32 | bfloat16 (both servers)")
    add("--threads", type=int, default=None, help="model threads of each server")
    add("--max-num-seqs", type=int, default=256)
    add(
        "--async-scheduling",
        action="store_true",
        help="pagedserve plans each step while the last computes (vLLM's CPU build turns its "
        "own off on CPU)",
    )
    add(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="n-gram speculative decoding (prompt lookup) in both servers; 0: off in both; "
        "default: each server's own (pagedserve 3 on CPU, vLLM off)",
    )
    add(
        "--speculative-max-num-seqs",
        type=int,
        default=DEFAULT_SPECULATIVE_MAX_NUM_SEQS,
        help="pagedserve drafts only in steps of at most this many sequences",
    )
    add("--concurrency", default="16,64", help="fixed levels of requests in flight")
    add("--rates", default="0.5,1,2", help="Poisson request rates (req/s) of the sweep")
    add("--rounds", type=int, default=1, help="alternated rounds; metrics are their medians")
    add("--max-steal", type=float, default=0.10,
        help="a round's point with more of the CPU stolen than this is thrown out")  # fmt: skip
    add("--num-warmups", type=int, default=8)
    add("--vllm-kv-cache-gib", type=int, default=3)
    add("--vllm-args", default="",
        help="more flags for vLLM's server, e.g. --vllm-args='--block-size 16'")  # fmt: skip
    add("--startup-timeout", type=float, default=600.0, help="seconds for pagedserve to start")
    add("--vllm-startup-timeout", type=float, default=1200.0, help="its first start compiles")
    add("--out", default="benchmarks/results/vs_vllm")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    args.dtype_resolved = resolved_dtype(args.dtype)
    requests, tokenizer, model_dir = build_workload(workload_args(args))
    loads = sweep_loads(ints(args.concurrency), floats(args.rates), args.seed)
    levels = plan_levels(requests, tokenizer, loads, args.seed, synthetic=True)
    warmup = warmup_requests(requests, tokenizer, args.num_warmups, args.seed + len(loads))
    machine = machine_info() | {"lscpu_isa_flags": lscpu_isa()}
    result: dict[str, Any] = {
        "machine": machine,
        "dtype": args.dtype_resolved,
        "threads": args.threads,
        "async_scheduling": args.async_scheduling,
        "num_speculative_tokens": args.num_speculative_tokens,
        "speculative_max_num_seqs": args.speculative_max_num_seqs,
        "max_steal": args.max_steal,
        "workload": workload_summary(requests),
        "command": shlex.join(
            ["python", "-m", "benchmarks.vs_vllm", *(sys.argv[1:] if argv is None else argv)]
        ),
    }
    if args.vllm_python:
        result["peer"] = peer_info(vllm_config(args, model_dir))
    result["rounds"] = rounds = alternate_servers(args, model_dir, (levels, warmup))
    result["medians"] = {
        name: median_over_rounds([r["points"] for r in server_rounds], args.max_steal)
        for name, server_rounds in rounds.items()
    }
    save(result, Path(args.out))
    failed = any(p["num_failed"] for rs in rounds.values() for r in rs for p in r["points"])
    return 1 if failed else 0


def save(result: dict[str, Any], out: Path) -> None:
    from benchmarks.vs_vllm_report import report

    write_json(result, out.with_suffix(".json"))
    out.with_suffix(".md").write_text(report(result) + "\n")
    title = f"{result['machine']['cpu']}, {result['dtype']}, threads {result['threads']}"
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", flush=True)
    try:
        plot = write_rate_plots(result["medians"], out.with_name(out.name + "_rates.png"), title)
    except ValueError as exc:  # every rate point thrown out for steal, or no rates asked
        print(f"no rate plot: {exc}", flush=True)
        return
    print(f"wrote {plot}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
