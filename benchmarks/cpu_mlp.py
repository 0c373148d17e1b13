"""The default model's MLPs on the CPU, fused against unfused, in one process: every layer's
MLP (gate-and-up product, silu(gate) * up, down product) through the packed linear method,
with the fused SwiGLU pass (`cpu_prepack.swiglu`: the float32 kernel's `small_sgemm_swiglu`,
the bf16 kernel's `small_gemm_swiglu`) and with it refused (the product, then torch's ops),
alternated, best of `--rounds`, at each row count.

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.cpu_mlp --dtype float32 --rows 1,16,64,512
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.kv_memory import build_engine
from benchmarks.machine_info import machine_info
from pagedserve.services.gpu_worker.platforms import cpu_prepack


def time_mlps(mlps: list[torch.nn.Module], x: torch.Tensor) -> float:
    with torch.inference_mode():
        start = time.perf_counter()
        for mlp in mlps:
            mlp(x)
        return time.perf_counter() - start


def best_of(rounds: int, variants: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each variant's best time, the order flipped every round."""
    names = list(variants)
    best = dict.fromkeys(names, float("inf"))
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            best[name] = min(best[name], variants[name]())
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_mlp", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rows", default="1,16,64,512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    engine = build_engine(args.model, 16, None, args.dtype, args.threads)
    mlps = [layer.mlp for layer in engine.runner.model.layers]
    hidden = engine.runner.model.embed_tokens.weight.shape[1]
    fused = cpu_prepack.swiglu

    def run(x: torch.Tensor, with_fused: bool) -> float:
        cpu_prepack.swiglu = fused if with_fused else (lambda *_: None)
        try:
            return time_mlps(mlps, x)
        finally:
            cpu_prepack.swiglu = fused

    machine = machine_info()
    print(f"{len(mlps)} MLPs, {args.dtype}, {args.threads} threads, "
          f"ISA caps {machine.get('isa_env')}, best of {args.rounds} alternated")  # fmt: skip
    print("| rows | unfused ms | fused ms | ratio | saved us a token |\n|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, hidden).to(getattr(torch, args.dtype))
        best = best_of(args.rounds, {
            "unfused": lambda x=x: run(x, False), "fused": lambda x=x: run(x, True),
        })  # fmt: skip
        unfused, fused_s = best["unfused"], best["fused"]
        print(f"| {rows} | {1e3 * unfused:.2f} | {1e3 * fused_s:.2f} | {unfused / fused_s:.3f}x "
              f"| {1e6 * (unfused - fused_s) / rows:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
