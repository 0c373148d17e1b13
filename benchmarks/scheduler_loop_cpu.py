"""The scheduler process's CPU per step, alone: its real `EngineLoop` against a real Redis and
a real `WorkerLoop` whose fake model (`tests/integration/pipeline/test_engine_loop.py`) only
sleeps, so that nothing else competes for the cores and every CPU second of the scheduler's
thread is its own. Requests go in as a gateway sends them (XADD), in waves of `--num-seqs`
(all running together), each with a 60-token prompt and 40 output tokens.

Reports the scheduler thread's CPU per step (`/proc/self/task/<tid>/stat`) and, timed with
`thread_time` around each call, its synchronous parts (the scheduler core, the ledger, the
plan's publishing, the result's decoding, the status gauges). The rest is asyncio, redis-py
and ZeroMQ plumbing. On the 2-core box the model shares, every CPU millisecond here is one
the model loses (docs/PERFORMANCE_LOG.md, "Where 1.5x stands").

    python -m benchmarks.scheduler_loop_cpu --num-seqs 16,64 --step-ms 30 \\
      --out benchmarks/results/scheduler_loop_cpu
"""

from __future__ import annotations

import argparse
import collections
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.runner import write_json
from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.status_reporter import StatusReporter
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared import transport
from tests.integration.pipeline.test_engine_loop import Client, EngineHarness, FakeModel

PROMPT_LEN = 60
OUTPUT_LEN = 40
TIMED = (
    (Scheduler, "schedule"),
    (Scheduler, "update_from_output"),
    (Ledger, "collect"),
    (Ledger, "note_scheduled"),
    (Ledger, "admit"),
    (WorkerLink, "publish"),
    (StatusReporter, "after_step"),
)


class RoomyModel(FakeModel):
    """The fake model with room for waves of long-ish sequences."""

    num_blocks = 8192
    max_model_len = 2048


class PartTimer:
    """Adds each wrapped call's thread CPU seconds to `seconds[name]` (calls from the engine's
    thread only; the worker's thread decodes plans too)."""

    def __init__(self, thread_name: Callable[[], str]) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._thread_name = thread_name
        self._originals: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name != timer._thread_name():
                return original(*args, **kwargs)
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                timer.seconds[label] += time.thread_time() - start

        self._originals.append((owner, name, original))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)


def thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_waves(client: Client, num_seqs: int, waves: int, tag: str) -> None:
    for wave in range(waves):
        ids = [f"{tag}{wave}-{i}" for i in range(num_seqs)]
        for request_id in ids:
            client.submit(request_id, max_tokens=OUTPUT_LEN, prompt_len=PROMPT_LEN)
        client.finished(ids, timeout_s=600)


def measure(redis_url: str, num_seqs: int, step_s: float, waves: int) -> dict[str, Any]:
    namespace = f"sched-cpu-{uuid.uuid4().hex[:8]}"
    harness = EngineHarness(redis_url, namespace, model=RoomyModel(step_s))
    engine_thread = harness._threads[0]
    timer = PartTimer(lambda: engine_thread.name)
    try:
        harness.wait_ready()
        client = Client(redis_url, namespace)
        run_waves(client, num_seqs, 1, "warm")
        for owner, name in TIMED:
            timer.wrap(owner, name, f"{owner.__name__}.{name}")
        timer.wrap(transport, "_decode", "decoding messages (results)")
        scheduler = harness.engine.serving.scheduler
        steps_before, cpu_before = (
            scheduler.stats().num_steps,
            thread_cpu_s(engine_thread.native_id),
        )
        started = time.perf_counter()
        run_waves(client, num_seqs, waves, "w")
        wall_s = time.perf_counter() - started
        cpu_s = thread_cpu_s(engine_thread.native_id) - cpu_before
        steps = scheduler.stats().num_steps - steps_before
    finally:
        timer.restore()
        harness.stop()
    parts = {k: 1000 * v / steps for k, v in timer.seconds.most_common()}
    return {"num_seqs": num_seqs, "step_ms": 1000 * step_s, "steps": steps,
            "cpu_ms_per_step": 1000 * cpu_s / steps, "wall_ms_per_step": 1000 * wall_s / steps,
            "parts_ms_per_step": parts,
            "rest_ms_per_step": 1000 * cpu_s / steps - sum(parts.values())}  # fmt: skip


def format_report(results: list[dict[str, Any]]) -> str:
    header = "| sequences | steps | scheduler CPU ms / step | timed parts | the rest |"
    lines = [header, "|---|---|---|---|---|"]
    for r in results:
        parts = "; ".join(f"{k} {v:.3f}" for k, v in r["parts_ms_per_step"].items())
        lines.append(f"| {r['num_seqs']} | {r['steps']} | {r['cpu_ms_per_step']:.2f} | "
                     f"{parts} | {r['rest_ms_per_step']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scheduler_loop_cpu")
    p.add_argument("--num-seqs", default="16,64", help="sequences running together")
    p.add_argument("--step-ms", type=float, default=30.0, help="the fake model's step")
    p.add_argument("--waves", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/scheduler_loop_cpu")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    redis = RedisServer(free_port()).start()
    try:
        results = [measure(redis.url, int(n), args.step_ms / 1000, args.waves)
                   for n in args.num_seqs.split(",")]  # fmt: skip
    finally:
        redis.stop()
    text = format_report(results)
    print(text)
    out = Path(args.out)
    write_json({"results": results, "machine": machine_info()}, out.with_suffix(".json"))
    out.with_suffix(".md").write_text(
        "# The scheduler's CPU per step, alone (`python -m benchmarks.scheduler_loop_cpu`)\n\n"
        + text
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
