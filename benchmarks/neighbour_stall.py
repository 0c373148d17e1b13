"""What a bursty neighbour costs a CPU worker's step: the in-process engine's decode step, alone
and beside a process that spins `--burst-ms` then sleeps the rest of each `--period-ms`, in
alternated rounds.

Under `pagedserve serve` on a small box the gateway, scheduler, Redis and the client wake once
per step and take a few ms of CPU each time, while the worker's OpenMP threads hold every core.
A descheduled thread holds up every barrier of the step, so a neighbour costs the step more
than the CPU it takes. `expected` is what the step would take if the neighbour cost only its
CPU: its share of one core spread over the worker's threads,

    expected = alone / (1 - duty / threads),   duty = burst / period

and `stall` is the measured step over that. 1.0: the neighbour cost its CPU and no more.

    python -m benchmarks.neighbour_stall --threads 2 --batch-sizes 8,64,256 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.machine_info import machine_info

NEIGHBOUR = """
import time
while True:
    end = time.perf_counter() + {burst_s}
    while time.perf_counter() < end:
        pass
    time.sleep({sleep_s})
"""


def neighbour_source(burst_ms: float, period_ms: float) -> str:
    if not 0 < burst_ms < period_ms:
        raise ValueError(f"need 0 < burst ({burst_ms} ms) < period ({period_ms} ms)")
    return NEIGHBOUR.format(burst_s=burst_ms / 1000, sleep_s=(period_ms - burst_ms) / 1000)


def expected_step_ms(alone_ms: float, duty: float, threads: int) -> float:
    """The step if the neighbour took only its CPU: `duty` of one core out of `threads`."""
    return alone_ms / (1 - duty / threads)


def measure(engine: Any, batch_sizes: list[int], num_decode: int) -> dict[int, float]:
    from benchmarks.roofline import decode_rate

    return {b: decode_rate(engine, b, 64, num_decode)["step_ms"] for b in batch_sizes}


def run_rounds(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    """`args.rounds` x (alone, beside the neighbour): variant -> batch size -> step ms."""
    from benchmarks.kv_memory import build_engine
    from benchmarks.roofline import decode_rate

    engine = build_engine(args.model, max(args.batch_sizes), None, args.dtype, args.threads)
    decode_rate(engine, 8, 8, 4)  # warm-up
    steps: dict[str, dict[int, list[float]]] = {"alone": {}, "beside": {}}
    source = neighbour_source(args.burst_ms, args.period_ms)
    for _ in range(args.rounds):
        for variant in steps:
            neighbour = (
                subprocess.Popen([sys.executable, "-c", source]) if variant == "beside" else None
            )
            try:
                for b, ms in measure(engine, args.batch_sizes, args.num_decode).items():
                    steps[variant].setdefault(b, []).append(ms)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    return steps


def summarize(steps: dict[str, dict[int, list[float]]], duty: float, threads: int) -> list[dict]:
    rows = []
    for b, alone_runs in sorted(steps["alone"].items()):
        alone, beside = statistics.median(alone_runs), statistics.median(steps["beside"][b])
        expected = expected_step_ms(alone, duty, threads)
        rows.append({"batch_size": b, "alone_ms": alone, "beside_ms": beside,
                     "expected_ms": expected, "slowdown": beside / alone,
                     "stall": beside / expected})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.neighbour_stall",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-sizes", default="8,64,256")
    p.add_argument("--num-decode", type=int, default=24)
    p.add_argument("--burst-ms", type=float, default=1.5)
    p.add_argument("--period-ms", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the result here as JSON")
    args = p.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    duty = args.burst_ms / args.period_ms
    rows = summarize(run_rounds(args), duty, args.threads)
    for r in rows:
        print(f"batch {r['batch_size']}: alone {r['alone_ms']:.1f} ms, beside {r['beside_ms']:.1f} "
              f"(x{r['slowdown']:.2f}), its CPU alone would make {r['expected_ms']:.1f} "
              f"(stall x{r['stall']:.2f})")  # fmt: skip
    if args.out:
        result = {"machine": machine_info(), "args": vars(args), "duty": duty, "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
