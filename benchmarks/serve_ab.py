"""`pagedserve serve` of two checkouts, in alternated rounds: is the served throughput the same?

Each checkout runs its own console script from its own virtualenv (`DIR/.venv/bin/pagedserve
serve`), as a user starts it, on a free port with a private Redis; the load generator of this
checkout sends both the same seeded workload at the same concurrency levels. A round starts,
warms up, measures and stops one server, then the other; the order flips every round, so the
machine's drift falls on both alike. Each level's figure is the median over the rounds whose
steal stayed under `--max-steal`, and every round's head/base throughput ratio is kept.

    python -m benchmarks.serve_ab --base /work/base --rounds 4 --dtype float32 --threads 2 \\
      --out benchmarks/results/serve_ab

A flag of one checkout against its default: the same checkout on both sides, and the flag in
`--head-args` (e.g. `--base . --head-args=--async-scheduling`); a setting of its environment
in `--base-env` / `--head-env` (e.g. `--base . --base-env PAGEDSERVE_CPU_FUSED_FORWARD=0`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.bench_args import (
    add_workload_args,
    floats,
    ints,
    resolved_dtype,
    workload_args,
)
from benchmarks.machine_info import machine_info
from benchmarks.peer_server import PeerServer
from benchmarks.rate_sweep import median_over_rounds, sweep_loads
from benchmarks.vs_vllm import lscpu_isa, measure_round
from pagedserve.services.cli.loadgen.runner import (
    build_workload,
    plan_levels,
    warmup_requests,
    workload_summary,
    write_json,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.supervisor import ChildSpec

HERE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CheckoutServeConfig:
    checkout: Path  # holds .venv/bin/pagedserve
    model: str
    dtype: str
    threads: int | None
    startup_timeout_s: float
    serve_args: tuple[str, ...] = ()  # more `pagedserve serve` flags
    env: tuple[str, ...] = ()  # NAME=VALUE settings of the server's environment


class CheckoutServer(PeerServer):
    """`pagedserve serve` of one checkout, started in that checkout's directory (an older
    revision's children run `python -m services...`, which would find the directory's code)."""

    name: ClassVar[str] = "pagedserve serve"

    def child_spec(self) -> ChildSpec:
        c = self.config
        argv = ["env", "-C", str(c.checkout), str(c.checkout / ".venv/bin/pagedserve"), "serve"]
        argv += ["--model", c.model, "--dtype", c.dtype, "--port", str(self.port)]
        argv += c.serve_args
        env = dict(os.environ)
        if c.threads:
            env["PAGEDSERVE_NUM_THREADS"] = str(c.threads)
        env.update(setting.split("=", 1) for setting in c.env)
        return ChildSpec(self.name, argv, env=env)

    def endpoint(self) -> EndpointConfig:
        return EndpointConfig(self.base_url, self.config.model)


def revision(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip()[:100]


def run_side(
    args: argparse.Namespace, checkout: Path, serve_args: str, env: str, plan: tuple
) -> dict[str, Any]:
    config = CheckoutServeConfig(
        checkout, args.model, args.dtype_resolved, args.threads, args.startup_timeout,
        tuple(shlex.split(serve_args)), tuple(shlex.split(env)),
    )  # fmt: skip
    log_path = Path(tempfile.gettempdir()) / f"pagedserve-serve-ab-{checkout.name}.log"
    print(f"starting {checkout}'s pagedserve serve (logs: {log_path})", flush=True)
    with log_path.open("w") as log, CheckoutServer(config, log=log) as server:
        return measure_round(server.endpoint(), *plan, args.startup_timeout)


def alternate(args: argparse.Namespace, plan: tuple) -> dict[str, list[dict[str, Any]]]:
    """base, head; head, base; ...: side name -> its rounds."""
    sides = {"base": Path(args.base).resolve(), "head": Path(args.head).resolve()}
    rounds: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    for index in range(args.rounds):
        order = ["base", "head"] if index % 2 == 0 else ["head", "base"]
        print(f"round {index + 1} of {args.rounds}: {' then '.join(order)}", flush=True)
        for side in order:
            serve_args = args.head_args if side == "head" else args.base_args
            env = args.head_env if side == "head" else args.base_env
            rounds[side].append(run_side(args, sides[side], serve_args, env, plan))
    return rounds


def ratios_by_round(rounds: dict[str, list[dict[str, Any]]]) -> list[list[float | None]]:
    """Per level, head/base output tok/s of each round."""
    per_round = zip(rounds["head"], rounds["base"], strict=True)
    table = [
        [round(h["output_tok_s"] / b["output_tok_s"], 3) if b["output_tok_s"] else None
         for h, b in zip(head["points"], base["points"], strict=True)]
        for head, base in per_round
    ]  # fmt: skip
    return [list(level) for level in zip(*table, strict=True)]


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"base: {result['base']} {result.get('base_args', '')}".rstrip(),
        f"head: {result['head']} {result.get('head_args', '')}".rstrip(),
        "",
    ]
    lines += ["| level | base tok/s | head tok/s | head/base of medians | by round | "
              "TTFT p50 / p99 ms (base / head) | TPOT p50 / p99 ms (base / head) |"]  # fmt: skip
    lines += ["|---|---|---|---|---|---|---|"]
    medians = result["medians"]
    for base, head, by_round in zip(
        medians["base"], medians["head"], result["ratios_by_round"], strict=True
    ):
        ratio = head["output_tok_s"] / base["output_tok_s"] if base["output_tok_s"] else None
        lines.append(
            f"| {level_name(base)} | {base['output_tok_s']:.1f} | "
            f"{head['output_tok_s']:.1f} | {ratio:.3f} | {by_round} | "
            f"{_pair(base, head, 'ttft')} | {_pair(base, head, 'tpot')} |"
        )
    if by_round := [r for level in result["ratios_by_round"] for r in level if r]:
        lines += ["", f"median of every round's ratio: {statistics.median(by_round):.3f}"]
    return "\n".join(lines)


def level_name(point: dict[str, Any]) -> str:
    rate = point.get("request_rate")
    return f"{rate:g} req/s" if rate else f"{point['max_concurrency']} in flight"


def _pair(base: dict[str, Any], head: dict[str, Any], metric: str) -> str:
    def ms(p: dict[str, Any], q: str) -> str:
        value = p.get(f"{metric}_{q}_ms")
        return "-" if value is None else f"{value:.0f}"

    return f"{ms(base, 'p50')} / {ms(head, 'p50')}, {ms(base, 'p99')} / {ms(head, 'p99')}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_ab",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add = p.add_argument
    add_workload_args(add)
    add("--base", required=True, help="the checkout measured against (has .venv)")
    add("--head", default=str(HERE), help="default: this checkout")
    add("--dtype", default="auto", help="auto | float32 | bfloat16 (both sides)")
    add("--threads", type=int, default=None, help="PAGEDSERVE_NUM_THREADS of both workers")
    add("--concurrency", default="16,64", help="levels of requests in flight")
    add("--rates", default="", help="Poisson request rates (req/s) after the levels")
    add("--base-args", default="", help="more `pagedserve serve` flags of the base side")
    add("--head-args", default="", help="more `pagedserve serve` flags of the head side")
    add("--base-env", default="", help="NAME=VALUE settings of the base side's environment")
    add("--head-env", default="", help="NAME=VALUE settings of the head side's environment")
    add("--rounds", type=int, default=4)
    add("--max-steal", type=float, default=0.10)
    add("--num-warmups", type=int, default=8)
    add("--startup-timeout", type=float, default=600.0)
    add("--out", default="benchmarks/results/serve_ab")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dtype_resolved = resolved_dtype(args.dtype)
    requests, tokenizer, _model_dir = build_workload(workload_args(args))
    loads = sweep_loads(ints(args.concurrency), floats(args.rates), args.seed)
    levels = plan_levels(requests, tokenizer, loads, args.seed, synthetic=True)
    warmup = warmup_requests(requests, tokenizer, args.num_warmups, args.seed + len(loads))
    result: dict[str, Any] = {
        "machine": machine_info() | {"lscpu_isa_flags": lscpu_isa()},
        "base": revision(Path(args.base)),
        "head": revision(Path(args.head)),
        "base_args": " ".join(filter(None, [args.base_env, args.base_args])),
        "head_args": " ".join(filter(None, [args.head_env, args.head_args])),
        "dtype": args.dtype_resolved,
        "threads": args.threads,
        "workload": workload_summary(requests),
        "command": shlex.join(["python", "-m", "benchmarks.serve_ab", *(argv or sys.argv[1:])]),
    }
    result["rounds"] = rounds = alternate(args, (levels, warmup))
    result["medians"] = {
        side: median_over_rounds([r["points"] for r in side_rounds], args.max_steal)
        for side, side_rounds in rounds.items()
    }
    result["ratios_by_round"] = ratios_by_round(rounds)
    out = Path(args.out)
    write_json(result, out.with_suffix(".json"))
    out.with_suffix(".md").write_text(summary(result) + "\n")
    print(summary(result), flush=True)
    failed = any(p["num_failed"] for rs in rounds.values() for r in rs for p in r["points"])
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
