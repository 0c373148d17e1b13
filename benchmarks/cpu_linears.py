"""A decode step's linears on the CPU, product by product: the default model's 4 linears per
layer times its layers, plus the LM head, each with its own weight (so the weights stream
from memory, as in a step), at each row count, through every path `platforms/cpu_prepack.py`
can take for the dtype.

    python -m benchmarks.cpu_linears --dtype bfloat16 --rows 1,4,16,32,64,128,512
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.cpu_linears --dtype float32

bf16: `F.linear` (oneDNN, re-packing the weight per call), oneDNN packed once
(`mkldnn._linear_pointwise`), and `kernels/cpu_small_gemm.c` with AMX tiles and with
`vdpbf16ps` tiles where the CPU has them. fp32: `F.linear`, MKL packed, oneDNN packed and,
where it builds,
`kernels/cpu_small_sgemm.c` (the layers use it on CPUs not made by Intel). The best of
`--repeats` passes over all the layers, in ms, with the machine's ISA flags.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.e2e_flops import model_dims
from benchmarks.machine_info import machine_info
from pagedserve.kernels import cpu_small_gemm, cpu_small_sgemm
from pagedserve.services.gpu_worker.platforms.cpu_prepack import MKL_PACK_ROWS

Product = Callable[[torch.Tensor], torch.Tensor]


def layer_shapes(model_dir: Path) -> list[tuple[int, int]]:
    """[out, in] of every linear of a step, in order (fused qkv and gate/up, as ours are)."""
    d = model_dims(model_dir)
    per_layer = [
        (d["attention_width"] + 2 * d["kv_width"], d["hidden"]),
        (d["hidden"], d["attention_width"]),
        (2 * d["intermediate"], d["hidden"]),
        (d["hidden"], d["intermediate"]),
    ]
    return per_layer * d["num_layers"] + [(d["vocab"], d["hidden"])]


def products(weight: torch.Tensor) -> dict[str, Product]:
    """Every path the worker can multiply this weight by, named."""
    if weight.dtype == torch.float32:
        mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, MKL_PACK_ROWS)
        fp32_paths: dict[str, Product] = {
            "F.linear": lambda x: F.linear(x, weight),
            "MKL packed": lambda x: torch.ops.mkl._mkl_linear(x, mkl, weight, None, x.shape[0]),
        }
        if torch.backends.mkldnn.is_available():
            blocked = torch.ops.mkldnn._reorder_linear_weight(weight, MKL_PACK_ROWS)
            fp32_paths["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(
                x, blocked, None, "none", [], ""
            )
        if cpu_small_sgemm.available():
            sgemm_panels = cpu_small_sgemm.pack(weight)
            fp32_paths["ours"] = lambda x: cpu_small_sgemm.linear(x, sgemm_panels, weight.shape[0])
        return fp32_paths
    paths: dict[str, Product] = {"F.linear": lambda x: F.linear(x, weight)}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # not on AVX2
        onednn = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        paths["oneDNN packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(
            x, onednn, None, "none", [], ""
        )
    if cpu_small_gemm.load() is not None:
        panels = cpu_small_gemm.pack(weight)
        paths["ours"] = lambda x: cpu_small_gemm.linear(x, panels, weight.shape[0])
    return paths


def time_pass(calls: list[Callable[[], object]], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def measure(shapes: list[tuple[int, int]], dtype: torch.dtype, rows: list[int], repeats: int):
    weights = [(torch.randn(n, k) / k**0.5).to(dtype) for n, k in shapes]
    paths = [products(w) for w in weights]
    table: dict[str, dict[int, float]] = {}
    for num_rows in rows:
        inputs = {k: torch.randn(num_rows, k).to(dtype) for _, k in shapes}
        for name in paths[0]:
            calls = [
                (lambda p=p[name], x=inputs[k]: p(x))
                for p, (_, k) in zip(paths, shapes, strict=True)
            ]
            table.setdefault(name, {})[num_rows] = time_pass(calls, repeats)
    return table


def main(argv: list[str] | None = None) -> None:
    from pagedserve.services.gpu_worker.default_model import ensure_default_model

    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_linears", description=__doc__)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--rows", default="1,4,8,16,32,64,128")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the table and machine as JSON here")
    p.add_argument("--model", default=None, help="a model directory (default: the default model)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    shapes = layer_shapes(Path(args.model) if args.model else ensure_default_model())
    table = measure(shapes, getattr(torch, args.dtype), rows, args.repeats)
    amx = "AMX" if cpu_small_gemm.amx_available() else "vdpbf16ps or none"
    print(f"{len(shapes)} products, {args.dtype}, {args.threads} threads, ms per step ({amx})")
    print("| rows | " + " | ".join(table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for num_rows in rows:
        print(f"| {num_rows} | " + " | ".join(f"{t[num_rows]:.1f}" for t in table.values()) + " |")
    if args.out:
        result = {
            "dtype": args.dtype,
            "threads": args.threads,
            "ms": table,
            "machine": machine_info(),
        }
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
