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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedserve.services.cli.loadgen.latency_stats import distribution
from pagedserve.services.cli.loadgen.workload import BenchRequest


def load_hf_model(
    model_dir: Path, dtype: torch.dtype, threads: int | None = None, device: str = "cpu"
) -> tuple[Any, Any | None]:
    """The model on `device`, and its tokenizer when the directory has one (prompts are token
    ids)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads or os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().to(device)
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
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        max_new_tokens=num_new,
        min_new_tokens=num_new,
        do_sample=False,
        pad_token_id=pad_id,
    )
    return int(out.shape[1] - max_prompt)


@dataclass
class StaticRun:
    """Raw timings of requests run in static batches (all arriving at time 0)."""

    batch_size: int
    requests: list[BenchRequest]
    duration_s: float
    e2e_s: list[float]  # per request: when its batch finished
    num_generated: int  # tokens generated, padding rows' extra tokens included

    def then(self, later: StaticRun) -> StaticRun:
        """This run followed by `later` (same batch size), as one run."""
        shifted = [self.duration_s + t for t in later.e2e_s]
        return StaticRun(self.batch_size, self.requests + later.requests,
                         self.duration_s + later.duration_s, self.e2e_s + shifted,
                         self.num_generated + later.num_generated)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        num_useful = sum(r.output_len for r in self.requests)
        return {
            "batch_size": self.batch_size,
            "num_requests": len(self.requests),
            "duration_s": self.duration_s,
            "total_output_tokens": num_useful,
            "num_generated_tokens": self.num_generated,  # useful + padding waste
            "request_throughput": len(self.requests) / self.duration_s,
            "output_throughput": num_useful / self.duration_s,
            "e2e_ms": distribution(self.e2e_s),
        }


def static_batches(
    model: Any, pad_id: int, requests: Sequence[BenchRequest], batch_size: int
) -> StaticRun:
    """The requests in static batches of `batch_size`, in order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start = time.perf_counter()
    e2e: list[float] = []
    num_generated = 0
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        num_generated += generate_batch(model, pad_id, batch) * len(batch)
        e2e.extend([time.perf_counter() - start] * len(batch))
    return StaticRun(batch_size, list(requests), time.perf_counter() - start, e2e, num_generated)


def run_static_batches(
    model: Any, pad_id: int, requests: Sequence[BenchRequest], batch_size: int
) -> dict[str, Any]:
    """The workload in static batches of `batch_size`; every request arrives at time 0."""
    return static_batches(model, pad_id, requests, batch_size).summary()


def run_hf_baseline(
    model_dir: Path,
    requests: Sequence[BenchRequest],
    dtype: torch.dtype,
    batch_sizes: Sequence[int] = (4, 16, 32),
    num_probe_requests: int | None = None,
    threads: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Probe each batch size on the first `num_probe_requests` requests (default: the largest
    batch size), then run the whole workload with the fastest. When the best probe's batches
    are exactly the workload's first batches, they are kept and only the rest is run."""
    if not batch_sizes:
        raise ValueError("batch_sizes must not be empty")
    model, tokenizer = load_hf_model(model_dir, dtype, threads, device)
    pad_id = _pad_id(model, tokenizer)
    generate_batch(model, pad_id, [BenchRequest("", requests[0].prompt_token_ids[:4], 2)])  # warm
    probe = list(requests[: num_probe_requests or max(batch_sizes)])
    probes = [static_batches(model, pad_id, probe, b) for b in batch_sizes]
    for p in probes:
        print(f"HF probe batch_size={p.batch_size}: {p.summary()['output_throughput']:.1f} "
              "out tok/s", flush=True)  # fmt: skip
    best = max(probes, key=lambda p: p.summary()["output_throughput"])
    rest = list(requests[len(probe) :])
    if len(probe) % best.batch_size == 0:
        full = best.then(static_batches(model, pad_id, rest, best.batch_size)) if rest else best
    else:
        full = static_batches(model, pad_id, requests, best.batch_size)
    summary = full.summary()
    print(
        f"HF generate batch_size={full.batch_size}: {summary['output_throughput']:.1f} out tok/s "
        f"over {summary['num_requests']} requests in {summary['duration_s']:.1f}s",
        flush=True,
    )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "num_threads": torch.get_num_threads(),
        "probes": [p.summary() for p in probes],
        **summary,
    }
