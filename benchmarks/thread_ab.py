"""OpenMP settings of the worker, A/B on this machine as it is (busy or not): each variant is
a fresh process (OpenMP reads its environment once, at load) that times the same decode steps
of the in-process engine; variants alternate round by round so that the machine's load drifts
over all of them alike. Reports each variant's median step time and CPU seconds per token
(spinning threads burn CPU that the gateway, scheduler and Redis need), and ratios to the
first variant.

    python -m benchmarks.thread_ab --variants "1:,2:,2:OMP_WAIT_POLICY=PASSIVE" --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.machine_info import machine_info


def parse_variant(text: str) -> tuple[int, dict[str, str]]:
    """`THREADS:NAME=VALUE,...` (the part after the colon may be empty)."""
    threads, _, env = text.partition(":")
    pairs = [p.split("=", 1) for p in env.split("+") if p]
    if not threads.isdigit() or int(threads) < 1 or any(len(p) != 2 for p in pairs):
        raise ValueError(f"a variant is THREADS:NAME=VALUE+NAME=VALUE, got {text!r}")
    return int(threads), dict(pairs)


def child(batch_size: int, prompt_len: int, num_decode: int, threads: int) -> dict[str, Any]:
    """One variant's measurement, in this process."""
    from benchmarks.kv_memory import build_engine
    from benchmarks.roofline import decode_rate

    engine = build_engine("smollm2", 256, None, "auto", threads)
    decode_rate(engine, batch_size, prompt_len, 4)  # warm-up
    cpu, wall = time.process_time(), time.perf_counter()
    rate = decode_rate(engine, batch_size, prompt_len, num_decode)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tokens = batch_size * (num_decode + 1)
    return {**rate, "cpu_s_per_token": cpu / tokens, "cpu_per_wall": cpu / wall}


def run_variant(args: argparse.Namespace, text: str) -> dict[str, Any]:
    threads, env = parse_variant(text)
    argv = [sys.executable, "-m", "benchmarks.thread_ab", "--child", str(threads),
            "--batch-size", str(args.batch_size), "--prompt-len", str(args.prompt_len),
            "--num-decode", str(args.num_decode)]  # fmt: skip
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(argv, env=full_env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(variants: list[str], rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per variant: median step ms and CPU s per token over rounds, and the median over rounds
    of its step time divided by the first variant's in the same round."""
    rows = []
    for i, name in enumerate(variants):
        steps = [r[i]["step_ms"] for r in rounds]
        ratios = [r[i]["step_ms"] / r[0]["step_ms"] for r in rounds]
        cpu = [r[i]["cpu_s_per_token"] for r in rounds]
        rows.append({"variant": name, "step_ms": statistics.median(steps),
                     "step_ratio_to_first": statistics.median(ratios),
                     "cpu_ms_per_token": 1000 * statistics.median(cpu)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.thread_ab", description=__doc__)
    p.add_argument("--variants", default="1:,2:,2:OMP_WAIT_POLICY=PASSIVE")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--num-decode", type=int, default=24)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.child:
        result = child(args.batch_size, args.prompt_len, args.num_decode, args.child)
        print(json.dumps(result))
        return 0
    variants = args.variants.split(",")
    rounds = []
    for r in range(args.rounds):
        rounds.append([run_variant(args, v) for v in variants])
        times = (f"{v} {x['step_ms']:.0f} ms" for v, x in zip(variants, rounds[-1], strict=True))
        print(f"round {r}: " + ", ".join(times), flush=True)
    report = {"machine": machine_info(), "rounds": rounds, "summary": summarize(variants, rounds)}
    for row in report["summary"]:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
