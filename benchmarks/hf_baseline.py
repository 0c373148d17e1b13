"""The Hugging Face baseline: transformers `generate` over static batches of the workload.

Requests are taken in workload order, `batch_size` at a time, left-padded, and each batch
generates as many tokens as its longest request asks for (greedy, EOS ignored through
`min_new_tokens`), which is what a static-batching server does: a short request waits for the
longest one of its batch, and the tokens generated past its own length are waste. Throughput
counts only the tokens each request asked for. A few batch sizes are probed on a prefix of the
workload and the best one runs the whole workload.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.latency_stats import distribution
from benchmarks.workload import BenchRequest


def load_hf_model(
    model_dir: Path, dtype: torch.dtype, threads: int | None = None
) -> tuple[Any, Any | None]:
    """The model, and its tokenizer when the directory has one (prompts are token ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads or os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    has_tokenizer = any((Path(model_dir) / f).is_file()
                        for f in ("tokenizer.json", "tokenizer_config.json"))  # fmt: skip
    return model, AutoTokenizer.from_pretrained(model_dir) if has_tokenizer else None


def _pad_id(model: Any, tokenizer: Any | None) -> int:
    config = model.config
    tok = (tokenizer.pad_token_id, tokenizer.eos_token_id) if tokenizer is not None else ()
    for candidate in (*tok, config.pad_token_id, config.eos_token_id):
        if isinstance(candidate, list):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


@torch.inference_mode()
def generate_batch(model: Any, pad_id: int, batch: Sequence[BenchRequest]) -> int:
    """Generate one static batch; the number of tokens it produced per row."""
    max_prompt = max(r.prompt_len for r in batch)
    num_new = max(r.output_len for r in batch)
    input_ids = torch.full((len(batch), max_prompt), pad_id, dtype=torch.long)  # [B, S]
    attention_mask = torch.zeros_like(input_ids)  # [B, S]
    for row, request in enumerate(batch):
        input_ids[row, max_prompt - request.prompt_len :] = torch.tensor(request.prompt_token_ids)
        attention_mask[row, max_prompt - request.prompt_len :] = 1
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return int(out.shape[1] - max_prompt)


def run_static_batches(
    model: Any, pad_id: int, requests: Sequence[BenchRequest], batch_size: int
) -> dict[str, Any]:
    """The workload in static batches of `batch_size`; every request arrives at time 0."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start = time.perf_counter()
    e2e: list[float] = []
    num_generated = 0
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        num_generated += generate_batch(model, pad_id, batch) * len(batch)
        e2e.extend([time.perf_counter() - start] * len(batch))
    duration = time.perf_counter() - start
    num_useful = sum(r.output_len for r in requests)
    return {
        "batch_size": batch_size,
        "num_requests": len(requests),
        "duration_s": duration,
        "total_output_tokens": num_useful,
        "num_generated_tokens": num_generated,  # useful + padding waste
        "request_throughput": len(requests) / duration,
        "output_throughput": num_useful / duration,
        "e2e_ms": distribution(e2e),
    }


def run_hf_baseline(
    model_dir: Path,
    requests: Sequence[BenchRequest],
    dtype: torch.dtype,
    batch_sizes: Sequence[int] = (4, 16, 32),
    num_probe_requests: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Probe each batch size on the first `num_probe_requests` requests (default: the largest
    batch size), then run the whole workload with the fastest."""
    if not batch_sizes:
        raise ValueError("batch_sizes must not be empty")
    model, tokenizer = load_hf_model(model_dir, dtype, threads)
    pad_id = _pad_id(model, tokenizer)
    generate_batch(model, pad_id, [BenchRequest("", requests[0].prompt_token_ids[:4], 2)])  # warm
    probe = list(requests[: num_probe_requests or max(batch_sizes)])
    probes = [run_static_batches(model, pad_id, probe, b) for b in batch_sizes]
    for p in probes:
        print(f"HF probe batch_size={p['batch_size']}: {p['output_throughput']:.1f} out tok/s")
    best = max(probes, key=lambda p: p["output_throughput"])
    if len(probe) == len(requests):  # the probes already ran the whole workload
        full = best
    else:
        full = run_static_batches(model, pad_id, list(requests), best["batch_size"])
    print(
        f"HF generate batch_size={full['batch_size']}: {full['output_throughput']:.1f} out tok/s "
        f"over {full['num_requests']} requests in {full['duration_s']:.1f}s",
        flush=True,
    )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "num_threads": torch.get_num_threads(),
        "probes": probes,
        **full,
    }
