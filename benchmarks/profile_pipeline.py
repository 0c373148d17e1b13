"""Where the time goes in `pagedserve serve`: every process of the pipeline profiled under load.

Starts the pipeline (Redis, scheduler, worker, gateway), warms it up, then sends a workload
while py-spy samples the Python stacks of the worker, scheduler and gateway (busy samples
only: a thread waiting in a syscall is not counted) and /proc gives each process's CPU
seconds, thread by thread (OpenMP's threads are native: they show there, not in py-spy).
The report is shares, not wall-clock: what fraction of each process's samples a function
takes, and how the machine's CPU seconds split between the processes, per output token. Shares
hold on a busy machine where absolute times do not.

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.profile_pipeline --num-prompts 32 --out benchmarks/results/profile
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.runner import (
    LoadConfig,
    run_load,
    warm_up,
    warmup_requests,
    write_json,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROFILED = ("worker", "scheduler", "gateway")


def parse_collapsed(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """py-spy's `--format raw` (collapsed stacks: `frame;frame;... count`) -> stack counts."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def frame_function(frame: str) -> str:
    """`fn (path/file.py:12)` -> `fn (file.py)`: one name per function, not per line."""
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1].rstrip(")")
    return f"{name} ({file})" if file else name


def inclusive_shares(stacks: Counter[tuple[str, ...]], top: int) -> list[tuple[str, float]]:
    """The `top` functions by the share of samples whose stack holds them (inclusive time)."""
    total = sum(stacks.values()) or 1
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        for function in {frame_function(f) for f in stack}:
            inclusive[function] += count
    return [(f, n / total) for f, n in inclusive.most_common(top)]


def self_shares(stacks: Counter[tuple[str, ...]], top: int) -> list[tuple[str, float]]:
    """The `top` leaf functions by the share of samples spent in them (self time)."""
    total = sum(stacks.values()) or 1
    leaves: Counter[str] = Counter()
    for stack, count in stacks.items():
        leaves[frame_function(stack[-1])] += count
    return [(f, n / total) for f, n in leaves.most_common(top)]


def start_py_spy(pid: int, out: Path, duration_s: int, rate: int) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(out),
            "--duration", str(duration_s), "--rate", str(rate), "--nonblocking"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of a process, keyed `name/tid`."""
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            seconds[f"{name}/{task.name}"] = process_cpu_seconds_of(task / "stat")
        except OSError:
            continue  # the thread ended
    return seconds


def process_cpu_seconds_of(stat: Path) -> float:
    """User + system CPU seconds from a /proc .../stat file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) > 0}


def stop_py_spy(proc: subprocess.Popen[bytes], out: Path) -> Counter[tuple[str, ...]]:
    """Stop a recording (SIGINT makes py-spy write what it has) and read its stacks."""
    proc.send_signal(2)
    _, err = proc.communicate(timeout=60)
    if not out.is_file():
        raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
    return parse_collapsed(out.read_text().splitlines())


def profile_load(pids: dict[str, int], endpoint: EndpointConfig, requests: list, args: Any,
                 workdir: Path) -> dict[str, Any]:  # fmt: skip
    """Run the load once with every process sampled; shares and CPU seconds per process."""
    recorders = {n: start_py_spy(p, workdir / f"{n}.txt", 3600, args.rate) for n, p in pids.items()}
    cpu_before = {n: thread_cpu_seconds(p) for n, p in pids.items()}
    summary = asyncio.run(
        run_load(endpoint, requests, LoadConfig(max_concurrency=args.concurrency))
    )
    cpu_after = {n: thread_cpu_seconds(p) for n, p in pids.items()}
    report: dict[str, Any] = {"duration_s": summary["duration_s"],
                              "output_tokens": summary["total_output_tokens"],
                              "output_throughput": summary["output_throughput"]}  # fmt: skip
    for name, proc in recorders.items():
        stacks = stop_py_spy(proc, workdir / f"{name}.txt")
        threads = cpu_delta(cpu_before[name], cpu_after[name])
        report[name] = {
            "cpu_s": sum(threads.values()),
            "cpu_s_per_output_token": sum(threads.values())
            / max(1, summary["total_output_tokens"]),
            "thread_cpu_s": dict(sorted(threads.items(), key=lambda kv: -kv[1])[:8]),
            "num_samples": sum(stacks.values()),
            "inclusive": inclusive_shares(stacks, args.top),
            "self": self_shares(stacks, args.top),
        }
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['output_tokens']} output tokens in {report['duration_s']:.1f} s"]
    for name in PROFILED:
        r = report[name]
        lines.append(f"\n## {name}: {r['cpu_s']:.1f} CPU s "
                     f"({1000 * r['cpu_s_per_output_token']:.1f} ms per output token)")  # fmt: skip
        lines.append(
            "threads (CPU s): " + ", ".join(f"{k} {v:.1f}" for k, v in r["thread_cpu_s"].items())
        )
        lines.append("inclusive: " + "; ".join(f"{f} {100 * s:.0f}%" for f, s in r["inclusive"]))
        lines.append("self: " + "; ".join(f"{f} {100 * s:.0f}%" for f, s in r["self"]))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_pipeline")
    add = p.add_argument
    add("--model", default="smollm2")
    add("--dtype", default="auto")
    add("--threads", type=int, default=None, help="the worker's OMP threads (default: its own)")
    add("--num-prompts", type=int, default=32)
    add("--concurrency", type=int, default=64)
    add("--prompt-len", type=int, default=64)
    add("--output-len", type=int, default=48)
    add("--rate", type=int, default=50, help="py-spy samples per second")
    add("--async-scheduling", action="store_true", help="the scheduler plans ahead")
    add("--top", type=int, default=25)
    add("--out", default="benchmarks/results/profile")
    return p


def main(argv: list[str] | None = None) -> int:
    from benchmarks.vs_transformers_serve import build_parser as workload_parser
    from benchmarks.vs_transformers_serve import workload_args
    from pagedserve.services.cli.loadgen.pipeline_launcher import LocalPipeline, PipelineConfig
    from pagedserve.services.cli.loadgen.runner import build_workload

    args = build_parser().parse_args(argv)
    lengths = ["--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len)]
    flags = ["--model", args.model, "--num-prompts", str(args.num_prompts), *lengths]
    wl = workload_parser().parse_args(flags)
    requests, tokenizer, model_dir = build_workload(workload_args(wl))
    config = PipelineConfig(
        model_dir, args.dtype, worker_threads=args.threads, async_scheduling=args.async_scheduling
    )
    workdir = Path(tempfile.mkdtemp(prefix="pagedserve-profile-"))
    with (workdir / "pipeline.log").open("w") as log, LocalPipeline(config, log=log) as pipeline:
        pids = {c.name: c.pid for c in pipeline.supervisor.children if c.name in PROFILED}
        endpoint = EndpointConfig(pipeline.base_url, str(model_dir))
        warm_up(endpoint, warmup_requests(requests, tokenizer, 4, 1000))
        report = profile_load(pids, endpoint, requests, args, workdir)
    report["machine"] = machine_info()
    text = format_report(report)
    print(text)
    out = Path(args.out)
    write_json(report, out.with_suffix(".json"))
    out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
