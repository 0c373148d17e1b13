"""Roofline note: the engine's decode throughput against the limit its FLOPs set.

A decode step of a batch of B sequences costs, per token, `2 * matmul_params` FLOPs (every
linear layer and the LM head; the embedding lookup is free) plus attention, `4 * layers *
context * num_heads * head_dim` (QK^T and PV). The machine's rate is a large square matmul
timed in the same process, in the engine's dtype and fp32 (for fp32 the faster of `torch.mm`
and the float32 kernel at 128 rows: MKL runs at about half the machine's peak on AMD CPUs).
The limit in tokens/s is rate / FLOPs-per-token; on a CPU with small batches decode is
usually bound by memory bandwidth (weights re-read every step) rather than FLOPs, which the
note says when it is.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.kv_memory import build_engine, run_engine
from pagedserve.kernels import cpu_small_sgemm
from pagedserve.services.cli.loadgen.workload import BenchRequest


def _best_time(product: Callable[[], object], num_iters: int) -> float:
    product()  # warm-up: thread pool, kernel choice
    best = float("inf")
    for _ in range(num_iters):
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops_per_s(dtype: torch.dtype, size: int = 2048, num_iters: int = 6) -> float:
    """Best-of-`num_iters` FLOP rate of a `size` x `size` matmul (`torch.mm`)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    return 2 * size**3 / _best_time(lambda: torch.mm(a, b), num_iters)


def sgemm_kernel_flops_per_s(rows: int = 128, size: int = 2048, num_iters: int = 6) -> float | None:
    """Best-of-`num_iters` FLOP rate of `rows` x `size` times a `size` x `size` weight through
    the float32 kernel (`kernels/cpu_small_sgemm.c`), None where it is not built. Where MKL
    runs a generic path (AMD CPUs) this is the machine's fp32 limit, not `torch.mm`'s."""
    if not cpu_small_sgemm.available():
        return None
    packed = cpu_small_sgemm.pack(torch.randn(size, size))
    x = torch.randn(rows, size)
    seconds = _best_time(lambda: cpu_small_sgemm.linear(x, packed, size), num_iters)
    return 2 * rows * size**2 / seconds


def limit_flops_per_s(dtype: torch.dtype) -> float:
    """The machine's FLOP limit in `dtype`: `torch.mm`'s rate, or for float32 the faster of it
    and the float32 kernel's."""
    rate = matmul_flops_per_s(dtype)
    if dtype == torch.float32:
        rate = max(rate, sgemm_kernel_flops_per_s() or 0.0)
    return rate


def model_shape(model: Any) -> dict[str, int]:
    """Parameter counts that matter for FLOPs, from a loaded pagedserve model."""
    config = model.config
    num_params = sum(p.numel() for p in model.parameters())
    embed = config.vocab_size * config.hidden_size
    tied = bool(getattr(config, "tie_word_embeddings", False))
    # Tied: the embedding matrix is counted once but used as the LM head matmul too.
    matmul_params = num_params if tied else num_params - embed
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "num_params": num_params,
        "matmul_params": matmul_params,
        "num_layers": config.num_hidden_layers,
        "attention_width": config.num_attention_heads * head_dim,
    }


def flops_per_token(shape: dict[str, int], context_len: float) -> float:
    attention = 4 * shape["num_layers"] * context_len * shape["attention_width"]
    return 2 * shape["matmul_params"] + attention


def decode_rate(engine: Any, batch_size: int, prompt_len: int, num_decode: int) -> dict[str, Any]:
    """Decode tokens/s of `batch_size` sequences: the median of the pure-decode steps."""
    prompt = list(range(100, 100 + prompt_len))
    requests = [BenchRequest("", [*prompt[i % 7 :], i], num_decode) for i in range(batch_size)]
    run = run_engine(engine, requests, trace=False)
    decode_steps = [t for t, b in zip(run.step_times_s, run.batch_sizes, strict=True)
                    if b == batch_size][1:]  # fmt: skip
    step_s = statistics.median(decode_steps or run.step_times_s)
    return {"batch_size": batch_size, "step_ms": 1000 * step_s, "tokens_per_s": batch_size / step_s}


def roofline_report(
    model: str,
    dtype: str,
    batch_sizes: Sequence[int],
    prompt_len: int = 64,
    num_decode: int = 16,
    threads: int | None = None,
) -> dict[str, Any]:
    engine = build_engine(model, max(batch_sizes), 4096, dtype, threads)
    engine_dtype = engine.runner.dtype
    rates = {
        str(engine_dtype).removeprefix("torch."): limit_flops_per_s(engine_dtype),
        "float32": limit_flops_per_s(torch.float32),
    }
    shape = model_shape(engine.runner.model)
    decode_rate(engine, 2, 8, 2)  # warm-up
    levels = [decode_rate(engine, b, prompt_len, num_decode) for b in batch_sizes]
    best = max(levels, key=lambda x: x["tokens_per_s"])
    context = prompt_len + num_decode / 2
    fpt = flops_per_token(shape, context)
    rate = rates[str(engine_dtype).removeprefix("torch.")]
    limit = rate / fpt
    return {
        "model": str(engine.model_dir),
        "dtype": str(engine_dtype).removeprefix("torch."),
        "num_threads": torch.get_num_threads(),
        **shape,
        "context_len": context,
        "flops_per_token": fpt,
        "matmul_flops_per_s": rates,
        "decode_levels": levels,
        "best_batch_size": best["batch_size"],
        "best_decode_tokens_per_s": best["tokens_per_s"],
        "flop_limit_tokens_per_s": limit,
        "fraction_of_flop_limit": best["tokens_per_s"] / limit,
    }


def format_roofline(report: dict[str, Any]) -> str:
    rates = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in report["matmul_flops_per_s"].items())
    levels = ", ".join(
        f"B={x['batch_size']}: {x['tokens_per_s']:.0f} tok/s ({x['step_ms']:.0f} ms/step)"
        for x in report["decode_levels"]
    )
    return (
        f"matmul: {rates}\n"
        f"model: {report['num_params'] / 1e6:.1f}M params, {report['flops_per_token'] / 1e6:.0f} "
        f"MFLOP/token at context {report['context_len']:.0f}\n"
        f"decode ({report['dtype']}, {report['num_threads']} threads): {levels}\n"
        f"best {report['best_decode_tokens_per_s']:.0f} tok/s at B={report['best_batch_size']} = "
        f"{100 * report['fraction_of_flop_limit']:.0f}% of the FLOP limit "
        f"{report['flop_limit_tokens_per_s']:.0f} tok/s"
    )


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m benchmarks.roofline", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", default="16,64,128,256")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--prompt-len", type=int, default=32, help="context before decoding")
    p.add_argument("--num-decode", type=int, default=16, help="decode steps per level")
    p.add_argument("--out", default="benchmarks/results/roofline.json")
    args = p.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    report = roofline_report(args.model, args.dtype, batch_sizes, args.prompt_len,
                             args.num_decode, args.threads)  # fmt: skip
    print(format_roofline(report))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
