"""Scheduler overhead per step: schedule() + update_from_output() with 256 decoding sequences.

Run: python -m benchmarks.scheduler_overhead [--num-seqs 256] [--num-steps 2000]
Writes benchmarks/results/scheduler_overhead.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, StepPlan, StepResult

RESULT_PATH = Path(__file__).parent / "results" / "scheduler_overhead.md"


def make_scheduler(num_seqs: int, prompt_len: int, num_steps: int, block_size: int) -> Scheduler:
    max_len = prompt_len + num_steps + 8
    num_blocks = num_seqs * (-(-max_len // block_size))
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=num_seqs,
            max_num_batched_tokens=max(num_seqs * prompt_len, 2048),
            max_model_len=max_len,
            max_waiting=num_seqs,
        ),
        CacheConfig(block_size=block_size, num_blocks=num_blocks),
    )
    sampling = SamplingParams(max_tokens=num_steps + 4, eos_token_ids=(2,))
    for i in range(num_seqs):
        prompt = [1000 + i] + [3 + (j % 97) for j in range(prompt_len - 1)]
        scheduler.add_request(GenerateRequest(f"req-{i}", prompt, sampling))
    return scheduler


def sampled_result(plan: StepPlan, token_id: int) -> StepResult:
    seq_ids = [s.seq_id for s in plan.new_seqs] + [s.seq_id for s in plan.cached_seqs]
    return StepResult(plan.step_id, seq_ids, [token_id] * len(seq_ids))


def measure(num_seqs: int, prompt_len: int, num_steps: int, block_size: int) -> list[float]:
    scheduler = make_scheduler(num_seqs, prompt_len, num_steps, block_size)
    plan = scheduler.schedule()  # the prefill step, not timed
    scheduler.update_from_output(plan, sampled_result(plan, 5))
    times = []
    for step in range(num_steps):
        start = time.perf_counter()
        plan = scheduler.schedule()
        scheduled = time.perf_counter()
        result = sampled_result(plan, 5 + step % 50)  # stands in for the worker, not timed
        updating = time.perf_counter()
        deltas = scheduler.update_from_output(plan, result)
        end = time.perf_counter()
        times.append((scheduled - start) + (end - updating))
        assert len(plan.cached_seqs) == num_seqs and len(deltas) == num_seqs
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--num-steps", type=int, default=2000)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    times = measure(args.num_seqs, args.prompt_len, args.num_steps, args.block_size)
    median_ms = statistics.median(times) * 1e3
    p99_ms = percentile(times, 0.99) * 1e3
    command = (
        "python -m benchmarks.scheduler_overhead "
        f"--num-seqs {args.num_seqs} --num-steps {args.num_steps} "
        f"--prompt-len {args.prompt_len} --block-size {args.block_size}"
    )
    lines = [
        "# Scheduler overhead per step",
        "",
        f"schedule() + update_from_output() with {args.num_seqs} running sequences decoding "
        f"one token each, prompt {args.prompt_len} tokens, block_size {args.block_size}, over "
        f"{args.num_steps} steps (a block fills every {args.block_size} steps per sequence). "
        "Building the StepResult stands in for the worker and is not timed.",
        "",
        "| median (ms) | p99 (ms) | mean (ms) |",
        "|---|---|---|",
        f"| {median_ms:.3f} | {p99_ms:.3f} | {statistics.fmean(times) * 1e3:.3f} |",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()} (shared 2-core box, other "
        "jobs running).",
        "",
        f"Command: `{command}`",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        RESULT_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULT_PATH.write_text(report)


if __name__ == "__main__":
    main()
