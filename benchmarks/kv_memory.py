"""KV memory report: how much of the allocated KV cache holds real tokens, paged vs reserved.

The workload runs through the in-process engine (`services.engine.LLMEngine`); after every
step a `KVSnapshot` records, over the running requests, the blocks they hold, the tokens whose
KV is really stored, and what a reservation-based cache would hold for the same requests:
`prompt + max_tokens` slots each (a server that knows the output bound), and `max_model_len`
each (the worst case of vLLM's paper). At the step where the most blocks are allocated (the
peak) the report gives each scheme's fraction of slots holding real tokens and how many
requests of that size fit in the engine's whole KV cache.

    python -m benchmarks.kv_memory --num-prompts 64 --out benchmarks/results/kv_memory.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pagedserve.services.cli.loadgen.workload import BenchRequest


@dataclass(frozen=True)
class KVSnapshot:
    step: int
    num_running: int
    num_allocated_blocks: int  # blocks held by the running requests
    num_real_tokens: int  # tokens whose KV is stored (computed) in those blocks
    num_reserved_slots: int  # sum of prompt + max_tokens over the running requests
    token_counts: tuple[int, ...] = ()  # real tokens per running request


@dataclass
class EngineRun:
    """What one in-process run produced: its KV trace and its timing."""

    trace: list[KVSnapshot] = field(default_factory=list)
    duration_s: float = 0.0
    num_steps: int = 0
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    num_failed: int = 0
    step_times_s: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)  # sequences scheduled per step


def snapshot(engine: Any, step: int) -> KVSnapshot:
    """The running requests' KV footprint right after a step."""
    scheduler = engine.scheduler
    running = scheduler.running
    return KVSnapshot(
        step=step,
        num_running=len(running),
        num_allocated_blocks=sum(len(scheduler.kv.get_block_ids(r.request_id)) for r in running),
        num_real_tokens=sum(r.num_computed_tokens for r in running),
        num_reserved_slots=sum(r.num_prompt_tokens + r.sampling.max_tokens for r in running),
        token_counts=tuple(r.num_computed_tokens for r in running),
    )


def submit(engine: Any, requests: Sequence[BenchRequest], prefix: str = "kv") -> None:
    from pagedserve.shared.protocol import GenerateRequest, SamplingParams

    for index, request in enumerate(requests):
        sampling = SamplingParams(
            temperature=0.0, max_tokens=request.output_len, ignore_eos=True
        )  # fmt: skip
        engine.add_request(
            GenerateRequest(f"{prefix}-{index}", list(request.prompt_token_ids), sampling)
        )


def run_engine(engine: Any, requests: Sequence[BenchRequest], trace: bool = True) -> EngineRun:
    """Every request at once through `engine`, stepping until done."""
    run = EngineRun(num_prompt_tokens=sum(r.prompt_len for r in requests))
    submit(engine, requests, prefix=f"run{time.monotonic_ns()}")
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        deltas = engine.step()
        run.step_times_s.append(time.perf_counter() - step_start)
        # Scheduled this step: still running, plus those the step finished.
        num_finished = sum(1 for d in deltas if d.finished)
        run.batch_sizes.append(len(engine.scheduler.running) + num_finished)
        run.num_steps += 1
        for delta in deltas:
            run.num_output_tokens += len(delta.token_ids) + (delta.stop_token_id is not None)
            run.num_failed += delta.finish_reason == "error"
        if trace:
            run.trace.append(snapshot(engine, run.num_steps))
    run.duration_s = time.perf_counter() - start
    return run


def kv_report(
    trace: Sequence[KVSnapshot], block_size: int, num_total_blocks: int, max_model_len: int
) -> dict[str, Any]:
    """Utilization and capacity of paged vs reservation-based KV at the peak of `trace`."""
    if not trace:
        raise ValueError("the KV trace is empty: no step ran")
    peak = max(trace, key=lambda s: (s.num_allocated_blocks, s.step))
    if peak.num_running == 0:
        raise ValueError("no request was running at any step")
    total_slots = num_total_blocks * block_size
    schemes = {
        "paged": peak.num_allocated_blocks * block_size,
        "reserve_max_tokens": peak.num_reserved_slots,
        "reserve_max_model_len": peak.num_running * max_model_len,
    }
    report: dict[str, Any] = {
        "peak_step": peak.step,
        "num_running_at_peak": peak.num_running,
        "num_real_tokens_at_peak": peak.num_real_tokens,
        "block_size": block_size,
        "num_total_blocks": num_total_blocks,
        "total_slots": total_slots,
        "max_model_len": max_model_len,
    }
    if peak.token_counts:  # what other page sizes would have allocated for the same tokens
        report["paged_real_token_fraction_by_block_size"] = {
            str(size): peak.num_real_tokens / sum(-(-n // size) * size for n in peak.token_counts)
            for size in (1, 8, 16, 32)
            if peak.num_real_tokens
        }
    for name, slots in schemes.items():
        per_request = slots / peak.num_running
        report[name] = {
            "slots_at_peak": slots,
            "real_token_fraction": peak.num_real_tokens / slots,
            "slots_per_request": per_request,
            "requests_that_fit": total_slots * peak.num_running // slots,
        }
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"peak: step {report['peak_step']}, {report['num_running_at_peak']} running, "
        f"{report['num_real_tokens_at_peak']} real tokens; KV cache {report['total_slots']} "
        f"slots ({report['num_total_blocks']} blocks x {report['block_size']})"
    ]
    for name in ("paged", "reserve_max_tokens", "reserve_max_model_len"):
        s = report[name]
        lines.append(
            f"  {name:22s} {100 * s['real_token_fraction']:5.1f}% of slots hold real tokens, "
            f"{s['slots_per_request']:7.1f} slots/request, fits {s['requests_that_fit']} requests"
        )
    by_size = report.get("paged_real_token_fraction_by_block_size", {})
    if by_size:
        sizes = ", ".join(f"{size}: {100 * f:.1f}%" for size, f in by_size.items())
        lines.append(f"  paged with other block sizes (same tokens): {sizes}")
    return "\n".join(lines)


def build_engine(
    model: str,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    dtype: str,
    threads: int | None = None,
) -> Any:
    """An in-process engine; `threads` overrides the torch thread count the runner picked
    (on a small shared machine one thread per core that is really free beats them all: an
    OpenMP barrier waits for a thread whose core is busy elsewhere). A `max_num_batched_tokens`
    of None is the device default: what users get."""
    import torch

    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import CacheConfig, SchedulerConfig

    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
    )
    engine = LLMEngine(model, scheduler_config, CacheConfig(), dtype=dtype)
    if threads:
        torch.set_num_threads(threads)
    return engine


def main(argv: list[str] | None = None) -> None:
    from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload

    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_memory", description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--out", default="benchmarks/results/kv_memory.json")
    args = p.parse_args(argv)
    engine = build_engine(args.model, args.max_num_seqs, None, args.dtype, args.threads)
    requests = synthetic_workload(
        engine.tokenizer, args.num_prompts, LengthDistribution(args.prompt_len, 0.6, 8, 1024),
        LengthDistribution(args.output_len, 0.6, 4, 512), args.seed,
    )  # fmt: skip
    run = run_engine(engine, requests)
    report = kv_report(
        run.trace, engine.scheduler.block_size, engine.scheduler.num_blocks,
        engine.scheduler.config.max_model_len,
    )  # fmt: skip
    print(format_report(report))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    trace = [asdict(s) for s in run.trace]
    Path(args.out).write_text(json.dumps({**report, "trace": trace}, indent=1) + "\n")


if __name__ == "__main__":
    main()
