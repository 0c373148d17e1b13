"""The Triton fused-MoE kernel (`kernels/fused_moe.py`) against the torch grouping it
replaces on CUDA (`layers/fused_moe.grouped_experts`: one F.linear pair per chosen expert),
on one step of N tokens of real MoE expert shapes (one rank's experts at TP=1, random
weights, softmax top-k routing of random logits).

Both outputs are checked against each other first; then each is timed with CUDA events
(median of `--repeats` after a warm-up) and reported with its achieved TFLOP/s
(2 * T * k * 3 * H * I flops) and, for small steps, the bandwidth of the expert weights a
step must read (the distinct experts chosen x 3 * H * I elements).

    python -m benchmarks.moe_kernel [--tokens 1,16,64,256,1024,4096] [--out-dir DIR]
    python -m benchmarks.moe_kernel --smoke   # tiny shapes, Triton interpreter on CPU
    python -m benchmarks.moe_kernel --sweep   # also time each of SWEEP_TILES, report the best

--smoke runs every code path on the CPU under TRITON_INTERPRET=1 (set before the import):
its timings are NOT GPU numbers. Without CUDA and without --smoke it exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # name: (hidden, intermediate, experts, top_k), one rank's experts at TP=1
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "deepseek-v2-lite": (2048, 1408, 64, 6),
}
SMOKE_SHAPES = {"tiny": (64, 48, 8, 2)}
# (block_m, block_n, block_k, num_warps, num_stages) tried by --sweep
SWEEP_TILES = [
    (16, 64, 64, 4, 3), (16, 64, 128, 4, 4), (16, 128, 64, 4, 4), (16, 32, 128, 4, 4),
    (16, 64, 256, 8, 3), (32, 64, 64, 4, 3), (32, 128, 64, 4, 4), (64, 64, 64, 4, 3),
    (64, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4),
    (128, 256, 64, 8, 3),
]  # fmt: skip
SMOKE_SWEEP_TILES = [(16, 16, 16, 4, 1), (32, 32, 16, 4, 1)]


def build_step(shape: tuple[int, int, int, int], num_tokens: int, dtype, device):
    from pagedserve.services.gpu_worker.layers.fused_moe import StackedExperts
    from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts

    hidden, intermediate, num_experts, top_k = shape
    torch.manual_seed(0)
    experts = StackedExperts(num_experts, hidden, intermediate).to(device, dtype)
    experts.w13_weight.data.normal_(0, hidden**-0.5)
    experts.w2_weight.data.normal_(0, intermediate**-0.5)
    x = torch.randn(num_tokens, hidden, device=device, dtype=dtype)
    logits = torch.randn(num_tokens, num_experts, device=device)
    weights, ids = select_experts(logits, Routing(top_k, renormalize=True))
    return x, experts, weights.to(dtype), ids


def time_ms(call, repeats: int, device: torch.device) -> float:
    call()  # warm-up (compiles the kernel variant)
    if device.type != "cuda":
        start = time.perf_counter()
        call()
        return 1000 * (time.perf_counter() - start)
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


@torch.inference_mode()
def measure(
    name: str, shape, num_tokens: int, dtype, device, repeats: int, sweep_tiles: list
) -> dict[str, Any]:
    from pagedserve.kernels.fused_moe import Tiles, fused_experts
    from pagedserve.services.gpu_worker.layers.activation import activation_and_mul
    from pagedserve.services.gpu_worker.layers.fused_moe import grouped_experts

    x, experts, weights, ids = build_step(shape, num_tokens, dtype, device)
    act = activation_and_mul("silu")
    w13, w2 = experts.w13_weight, experts.w2_weight
    kernel = lambda: fused_experts(x, w13, w2, weights, ids)
    native = lambda: grouped_experts(x, experts, weights, ids, act)
    tolerance = 1e-4 if dtype == torch.float32 else 4e-2
    ok = torch.allclose(kernel().float(), native().float(), rtol=tolerance, atol=tolerance)
    kernel_ms = time_ms(kernel, repeats, device)
    native_ms = time_ms(native, repeats, device)
    swept: dict[str, float | None] = {}
    for tiles in sweep_tiles:
        call = lambda tiles=tiles: fused_experts(x, w13, w2, weights, ids, Tiles(*tiles))
        try:
            swept[str(tiles)] = round(time_ms(call, repeats, device), 4)
        except Exception as error:  # Triton's OutOfResources: more shared memory than an SM's
            print(f"{name} {num_tokens} {tiles}: {type(error).__name__}", flush=True)
            swept[str(tiles)] = None
    hidden, intermediate, _, top_k = shape
    flops = 2 * num_tokens * top_k * 3 * hidden * intermediate
    weight_bytes = int(ids.unique().numel()) * 3 * hidden * intermediate * x.element_size()
    row = {
        "shape": name, "tokens": num_tokens, "ok": ok,
        "kernel_ms": round(kernel_ms, 4), "torch_ms": round(native_ms, 4),
        "speedup": round(native_ms / kernel_ms, 2),
        "kernel_tflops": round(flops / kernel_ms / 1e9, 1),
        "kernel_weight_gbs": round(weight_bytes / kernel_ms / 1e6, 0),
    }  # fmt: skip
    timed = {tiles: ms for tiles, ms in swept.items() if ms is not None}
    if timed:
        best = min(timed, key=timed.get)
        row.update(best_tiles=best, best_ms=swept[best], swept=swept)
    return row


def markdown(rows: list[dict[str, Any]], device_name: str, dtype: str, smoke: bool) -> str:
    note = " (Triton interpreter on CPU: timings are NOT GPU numbers)" if smoke else ""
    head = ["shape", "tokens", "kernel_ms", "torch_ms", "speedup", "kernel_tflops",
            "kernel_weight_gbs", "ok"]  # fmt: skip
    if rows and "best_tiles" in rows[0]:
        head += ["best_tiles", "best_ms"]
    lines = [
        f"# Fused-MoE kernel vs torch grouping, {device_name}, {dtype}{note}",
        "",
        "`python -m benchmarks.moe_kernel" + (" --smoke`" if smoke else "`"),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [str(row[h]) if h != "ok" else ("ok" if row["ok"] else "MISMATCH") for h in head]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.moe_kernel", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, interpreter, CPU")
    p.add_argument("--tokens", default="1,16,64,256,1024,4096")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="also time every tile config")
    p.add_argument("--out-dir", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        device, shapes, tokens, dtype = torch.device("cpu"), SMOKE_SHAPES, [1, 19], torch.float32
        device_name = "CPU"
    elif not torch.cuda.is_available():
        print("benchmarks.moe_kernel needs a CUDA device (or --smoke for the CPU interpreter)")
        return 2
    else:
        device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
        shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
        tokens, device_name = [int(n) for n in args.tokens.split(",")], torch.cuda.get_device_name()
    rows = []
    for name, shape in shapes.items():
        for num_tokens in tokens:
            sweep = (SMOKE_SWEEP_TILES if args.smoke else SWEEP_TILES) if args.sweep else []
            rows.append(measure(name, shape, num_tokens, dtype, device, args.repeats, sweep))
            print(json.dumps(rows[-1]), flush=True)
    stem = "moe_kernel_cpu_interpreter" if args.smoke else f"moe_kernel_{args.dtype}"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype_name = str(dtype).removeprefix("torch.")
    (out_dir / f"{stem}.md").write_text(markdown(rows, device_name, dtype_name, args.smoke))
    report = {"device": device_name, "dtype": dtype_name, "rows": rows}
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
