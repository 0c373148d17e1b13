"""The CPU bf16 MLP's activation after the gate-and-up product: the C `silu_and_mul`
(`kernels/cpu_small_gemm.c`, the fused SwiGLU's roundings) against torch's `F.silu(gate) *
up`, at each row count, SmolLM2-135M's width (1536), median of `--repeats` timings of 20
calls each.

    python -m benchmarks.silu_and_mul --rows 16,64,512,2048 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.machine_info import machine_info
from pagedserve.kernels import cpu_small_gemm


def median_us(fn: Callable[[], torch.Tensor], repeats: int, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.silu_and_mul", description=__doc__)
    p.add_argument("--rows", default="16,64,512,2048")
    p.add_argument("--width", type=int, default=1536)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{machine_info()['cpu']}, {args.threads} threads, width {args.width}")
    print("| rows | torch us | C us | torch / C |\n|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        gate_up = (torch.randn(rows, 2 * args.width) * 3).bfloat16()

        def torch_ops(x: torch.Tensor = gate_up) -> torch.Tensor:
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate) * up

        ours = median_us(lambda x=gate_up: cpu_small_gemm.silu_and_mul(x), args.repeats)
        theirs = median_us(torch_ops, args.repeats)
        print(f"| {rows} | {theirs:.0f} | {ours:.0f} | {theirs / ours:.2f}x |")


if __name__ == "__main__":
    main()
