"""Where a level's wall time goes, in-process: the server comparisons' workload (`vs_vllm`'s
seeded requests, greedy, exact lengths) through the in-process engine with a fixed number in
flight (a new request each time one finishes, as the load generator's clients send them),
every step timed and sorted by what it carried: a chunk of some prompt (with the decodes that
ride along) or decodes only, and how many sequences.

    python -m benchmarks.level_split --dtype float32 --threads 2 --num-prompts 96 \\
      --concurrency 64 --out benchmarks/results/level_split.json

No server: this is the model's share of a `vs_vllm` level. Through `pagedserve serve` the
gateway, scheduler and Redis add what `benchmarks.profile_pipeline` shows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_args import add_workload_args, workload_args
from benchmarks.kv_memory import build_engine, submit
from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.runner import build_workload, write_json

SIZE_BUCKETS = (1, 4, 16, 32, 64)  # a step goes to the largest bucket its sequences reach


@dataclass(frozen=True)
class StepRecord:
    seconds: float
    num_seqs: int  # sequences the step computed
    prompt_tokens: int  # tokens of prompt chunks (a resumed sequence's, too)
    draft_tokens: int  # n-gram drafts verified
    output_tokens: int  # tokens the step gave its requests


def step_record(plan: Any, seconds: float, output_tokens: int) -> StepRecord:
    """What one step plan carried: every new sequence's tokens are prompt; a cached one is a
    prompt chunk where it computes more than one token besides its drafts."""
    prompt = sum(s.num_scheduled_tokens for s in plan.new_seqs)
    drafts = 0
    for seq in plan.cached_seqs:
        known = seq.num_scheduled_tokens - len(seq.draft_token_ids)
        drafts += len(seq.draft_token_ids)
        prompt += known if known > 1 else 0
    num_seqs = len(plan.new_seqs) + len(plan.cached_seqs)
    return StepRecord(seconds, num_seqs, prompt, drafts, output_tokens)


def bucket(record: StepRecord) -> tuple[bool, int]:
    """(carries a prompt chunk, the largest size bucket its sequences reach): sorts in order."""
    size = max((b for b in SIZE_BUCKETS if record.num_seqs >= b), default=SIZE_BUCKETS[0])
    return record.prompt_tokens > 0, size


def split(records: Sequence[StepRecord], wall_s: float) -> dict[str, dict[str, float]]:
    """Steps, seconds, share of the wall and tokens by bucket, in bucket order."""
    rows: dict[tuple[bool, int], dict[str, float]] = {}
    for record in records:
        row = rows.setdefault(bucket(record), dict.fromkeys(
            ("steps", "seconds", "share_of_wall", "prompt_tokens", "output_tokens"), 0.0
        ))  # fmt: skip
        row["steps"] += 1
        row["seconds"] += record.seconds
        row["prompt_tokens"] += record.prompt_tokens
        row["output_tokens"] += record.output_tokens
    for row in rows.values():
        row["share_of_wall"] = row["seconds"] / wall_s
        row["ms_per_step"] = 1e3 * row["seconds"] / row["steps"]
    return {
        f"{'prompt' if prompt else 'decode'}, {size}+ seqs": rows[(prompt, size)]
        for prompt, size in sorted(rows)
    }


class PlanRecorder:
    """Keeps the last plan the engine's scheduler made, while in a `with` block (wraps the
    scheduler's `schedule`, and puts it back after)."""

    def __init__(self, scheduler: Any) -> None:
        self.plan: Any = None
        self._scheduler = scheduler

    def __enter__(self) -> PlanRecorder:
        schedule = self._scheduler.schedule

        def record(*args: Any, **kwargs: Any) -> Any:
            self.plan = schedule(*args, **kwargs)
            return self.plan

        self._scheduler.schedule = record
        return self

    def __exit__(self, *exc: object) -> None:
        del self._scheduler.schedule  # the class's method again


def run_level(
    engine: Any, requests: Sequence[Any], concurrency: int
) -> tuple[list[StepRecord], float]:
    """Every request, `concurrency` in flight, a new one as each finishes; the steps and wall."""
    run = f"level{time.monotonic_ns()}"
    waiting = list(enumerate(requests))
    admit = min(concurrency, len(waiting))
    _submit(engine, run, waiting[:admit])
    waiting = waiting[admit:]
    records: list[StepRecord] = []
    start = time.perf_counter()
    with PlanRecorder(engine.scheduler) as recorder:
        while engine.has_unfinished_requests():
            step_start = time.perf_counter()
            deltas = engine.step()
            seconds = time.perf_counter() - step_start
            if recorder.plan is not None and not recorder.plan.is_empty:
                tokens = sum(len(d.token_ids) + (d.stop_token_id is not None) for d in deltas)
                records.append(step_record(recorder.plan, seconds, tokens))
            finished = sum(1 for d in deltas if d.finished)
            _submit(engine, run, waiting[:finished])
            waiting = waiting[finished:]
    return records, time.perf_counter() - start


def _submit(engine: Any, run: str, indexed: Sequence[tuple[int, Any]]) -> None:
    for index, request in indexed:
        submit(engine, [request], prefix=f"{run}-{index}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.level_split", description=__doc__)
    add_workload_args(p.add_argument)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="also write the split and machine as JSON here")
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error(f"--concurrency must be at least 1, got {args.concurrency}")
    workload = workload_args(args)
    requests = build_workload(workload)[0]
    workload.seed, workload.num_prompts = args.seed + 1, 4
    engine = build_engine(args.model, 256, None, args.dtype, args.threads)
    run_level(engine, build_workload(workload)[0], 4)  # warm-up, words of its own
    engine.reset_prefix_cache()
    records, wall_s = run_level(engine, requests, args.concurrency)
    table = split(records, wall_s)
    output_tokens = sum(r.output_tokens for r in records)
    print(
        f"{len(requests)} requests, {args.concurrency} in flight, {args.dtype}, {args.threads} "
        f"threads: {wall_s:.1f} s, {output_tokens} output tokens ({output_tokens / wall_s:.1f} "
        f"tok/s), {sum(r.prompt_tokens for r in records)} prompt tokens, {len(records)} steps"
    )
    print(
        "| steps carrying | steps | s | share of wall | prompt tokens | output tokens | ms a step |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in table.items():
        print(
            f"| {name} | {row['steps']:.0f} | {row['seconds']:.1f} | {row['share_of_wall']:.1%} | "
            f"{row['prompt_tokens']:.0f} | {row['output_tokens']:.0f} | {row['ms_per_step']:.0f} |"
        )
    if args.out:
        write_json(
            {
                "machine": machine_info(),
                "settings": vars(args),
                "wall_s": wall_s,
                "output_tokens": output_tokens,
                "split": table,
                "steps": [asdict(r) for r in records],
            },
            Path(args.out),
        )


if __name__ == "__main__":
    main()
