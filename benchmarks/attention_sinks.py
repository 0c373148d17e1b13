"""Attention with sinks (GPT-OSS: a learned logit per head in the softmax's denominator), the
ways this project computes it, timed on the same inputs in one run.

On the CPU (`attention/windowed.py`): the eager form (einsums and a softmax in float32, as
Hugging Face's eager attention) against the fused one (torch's CPU flash attention, whose
log-sum-exp rescales each row by its sink), alternating rounds. On CUDA: the Triton decode and
prefill kernels with sinks (SINKS) against the same kernels without (the flag's cost) and the
plain-torch reference (eager). Every form is first checked against the reference.

Cases: decodes (B sequences of one new token over C cached ones) and a prefill chunk (Q new
tokens over C), with full attention and with GPT-OSS's 128-token window, at GPT-OSS-20B's
attention geometry (64 query heads over 8 KV heads of 64).

    python -m benchmarks.attention_sinks [--device cpu|cuda] [--context N] [--rounds 5]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.machine_info import machine_info
from pagedserve.kernels import reference
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.windowed import windowed_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, WINDOW = 64, 8, 64, 16, 128


def paged_inputs(
    seq_lens: list[int], query_lens: list[int], dtype: torch.dtype, device: str
) -> dict[str, Any]:
    """A random paged cache holding the contexts (blocks in random order), the queries, the
    sinks and the step's metadata."""
    gen = torch.Generator().manual_seed(0)
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    order = torch.randperm(sum(blocks), generator=gen).tolist()
    tables = [[order.pop() for _ in range(n)] for n in blocks]
    shape = (sum(blocks), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2))
    query = torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
    sinks = torch.randn(NUM_HEADS, generator=gen).to(device)
    metadata = build_attention_metadata(seq_lens, query_lens, tables, BLOCK_SIZE, device)
    return {"query": query, "k_cache": k_cache, "v_cache": v_cache, "sinks": sinks,
            "metadata": metadata}  # fmt: skip


def reference_attention(x: dict[str, Any], window: int | None) -> torch.Tensor:
    md = x["metadata"]
    return reference.paged_prefill_attention(
        x["query"], x["k_cache"], x["v_cache"], md.block_tables, md.query_start_loc,
        md.seq_lens, HEAD_DIM**-0.5, sliding_window=window, sinks=x["sinks"],
    )  # fmt: skip


def cpu_forms(x: dict[str, Any], window: int | None) -> dict[str, Callable[[], torch.Tensor]]:
    def form(fused: bool) -> Callable[[], torch.Tensor]:
        return lambda: windowed_attention(
            x["query"], x["k_cache"], x["v_cache"], x["metadata"], HEAD_DIM**-0.5, window,
            None, x["sinks"], fused=fused,
        )  # fmt: skip

    return {"eager": form(False), "fused": form(True)}


def cuda_forms(x: dict[str, Any], window: int | None) -> dict[str, Callable[[], torch.Tensor]]:
    from pagedserve.kernels.paged_decode import paged_decode_attention
    from pagedserve.kernels.paged_prefill import paged_prefill_attention

    md = x["metadata"]
    scale = HEAD_DIM**-0.5

    def triton_form(sinks: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        if md.is_decode_only:
            return lambda: paged_decode_attention(
                x["query"], x["k_cache"], x["v_cache"], md.block_tables, md.seq_lens, scale,
                max_seq_len=md.max_seq_len, sliding_window=window, sinks=sinks,
            )  # fmt: skip
        return lambda: paged_prefill_attention(
            x["query"], x["k_cache"], x["v_cache"], md.block_tables, md.query_start_loc,
            md.seq_lens, scale, sliding_window=window, sinks=sinks,
        )  # fmt: skip

    return {"triton_sinks": triton_form(x["sinks"]), "triton_no_sinks": triton_form(None),
            "eager_reference": lambda: reference_attention(x, window)}  # fmt: skip


def time_ms(fn: Callable[[], torch.Tensor], device: str, repeats: int) -> float:
    if device == "cuda":
        import triton

        return float(triton.testing.do_bench(fn, warmup=5, rep=40))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def measure(name: str, seq_lens: list[int], query_lens: list[int], window: int | None,
            args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    x = paged_inputs(seq_lens, query_lens, dtype, args.device)
    forms = (cpu_forms if args.device == "cpu" else cuda_forms)(x, window)
    expected = reference_attention(x, window).float()
    errors = {}
    for form, fn in forms.items():
        if form != "triton_no_sinks":
            errors[form] = float((fn().float() - expected).abs().max())
    times: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(args.rounds):  # forms alternate within each round
        for form, fn in forms.items():
            times[form].append(time_ms(fn, args.device, args.repeats))
    first = next(iter(forms))
    row = {"case": name, "window": window, "dtype": str(dtype).removeprefix("torch."),
           "max_abs_error_vs_reference": errors}  # fmt: skip
    row.update({f"{form}_ms": statistics.median(t) for form, t in times.items()})
    for form in list(forms)[1:]:  # per round: form / first form
        ratios = [a / b for a, b in zip(times[form], times[first], strict=True)]
        row[f"{form}_over_{first}"] = statistics.median(ratios)
    return row


def cases(device: str, context: int) -> list[tuple[str, list[int], list[int]]]:
    """(name, seq_lens, query_lens): decodes over `context` keys, and prefill chunks."""
    if device == "cpu":
        chunk = context // 4
        return [(f"decode 8 x {context}", [context] * 8, [1] * 8),
                (f"prefill {chunk} over {context - chunk}", [context], [chunk])]  # fmt: skip
    half = context // 2
    return [(f"decode 64 x {context}", [context] * 64, [1] * 64),
            (f"decode 4 x {context}", [context] * 4, [1] * 4),
            (f"4 prefills {half} over {half}", [context] * 4, [half] * 4)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attention_sinks", description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--context", type=int, default=None, help="keys (CPU 1024, CUDA 4096)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="CPU calls per timing (median)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    context = args.context or (1024 if args.device == "cpu" else 4096)
    for name, seq_lens, query_lens in cases(args.device, context):
        for window in (None, WINDOW):
            rows.append(measure(name, seq_lens, query_lens, window, args))
            print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    geometry = [NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE]
    report = {"machine": machine_info(), "device": device, "threads": torch.get_num_threads(),
              "geometry": geometry, "rows": rows}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
