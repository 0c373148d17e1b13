"""End-to-end throughput as a fraction of the machine's FLOP limit.

The useful FLOPs of a workload: every prompt token and every output token but the last goes
through the layers once (2 FLOPs per linear weight, plus attention over its context, QK^T and
PV: 4 * context * heads * head_dim per layer), and every output token through the LM head.
Padding, recomputation and preemption are not counted: they are the server's waste. Divided by
the run's wall time and by a large matmul's FLOP rate measured in the same run, this says how
much of the machine a server turns into tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedserve.services.cli.loadgen.workload import BenchRequest


def model_dims(model_dir: Path) -> dict[str, int]:
    """The dimensions FLOPs depend on, from a Llama-family `config.json`."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return {
        "num_layers": config["num_hidden_layers"],
        "hidden": hidden,
        "attention_width": heads * head_dim,
        "kv_width": kv_heads * head_dim,
        "intermediate": config["intermediate_size"],
        "vocab": config["vocab_size"],
    }


def layer_weights(dims: dict[str, int]) -> int:
    """Linear weights one token multiplies in all layers (q, k, v, o, gate, up, down)."""
    h, a, kv, i = dims["hidden"], dims["attention_width"], dims["kv_width"], dims["intermediate"]
    return dims["num_layers"] * (h * a + 2 * h * kv + a * h + 3 * h * i)


def request_flops(dims: dict[str, int], prompt_len: int, output_len: int) -> float:
    """Useful FLOPs of one request (see the module docstring)."""
    num_through_layers = prompt_len + output_len - 1
    # token t (0-based) attends to t + 1 positions: sum over t of (t + 1)
    context_sum = num_through_layers * (num_through_layers + 1) / 2
    attention = 4 * dims["num_layers"] * dims["attention_width"] * context_sum
    linears = 2 * layer_weights(dims) * num_through_layers
    head = 2 * dims["vocab"] * dims["hidden"] * output_len
    return linears + attention + head


def workload_flops(dims: dict[str, int], requests: Sequence[BenchRequest]) -> float:
    return sum(request_flops(dims, r.prompt_len, r.output_len) for r in requests)


def fraction_of_flop_limit(flops: float, duration_s: float, flops_per_s: float) -> float:
    if duration_s <= 0 or flops_per_s <= 0:
        raise ValueError(f"need positive duration and rate, got {duration_s}, {flops_per_s}")
    return flops / duration_s / flops_per_s


def best_rate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of several `measured_rate` samples, with every sample's rate kept: the
    machine's limit is what it can do, and a sample taken while the VM's hypervisor steals or
    a server is still exiting reads low (76 against 108 GFLOP/s in two runs of one day),
    which would inflate every share of it."""
    if not samples:
        raise ValueError("no matmul rate was measured")
    best = max(samples, key=lambda sample: sample["flops_per_s"])
    return {**best, "samples_flops_per_s": [sample["flops_per_s"] for sample in samples]}


def measured_rate(dtype_name: str, threads: int | None) -> dict[str, Any]:
    """A large matmul's FLOP rate in `dtype_name` on `threads` threads (default: all): the
    machine's limit (`roofline.limit_flops_per_s`: for float32, the faster of `torch.mm` and
    the float32 kernel)."""
    import os

    import torch

    from benchmarks.roofline import limit_flops_per_s

    previous = torch.get_num_threads()
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    try:
        rate = limit_flops_per_s(getattr(torch, dtype_name))
        return {"dtype": dtype_name, "threads": torch.get_num_threads(), "flops_per_s": rate}
    finally:
        torch.set_num_threads(previous)
