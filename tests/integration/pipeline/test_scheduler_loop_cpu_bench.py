"""`benchmarks/scheduler_loop_cpu.py` on a small load: every step is counted, the scheduler's
CPU is positive and at least its timed parts, and the wrapped methods are restored."""

from __future__ import annotations

import pytest

from benchmarks import scheduler_loop_cpu as bench
from pagedserve.services.scheduler.scheduler import Scheduler

pytestmark = pytest.mark.integration


def test_the_scheduler_cpu_per_step_is_measured_and_split(redis_url: str) -> None:
    schedule = Scheduler.schedule
    result = bench.measure(redis_url, num_seqs=3, step_s=0.002, waves=1)
    # one wave: the prompts' step, then one step per output token after the first
    assert result["steps"] >= bench.OUTPUT_LEN
    assert result["cpu_ms_per_step"] > 0
    parts = result["parts_ms_per_step"]
    assert {"Scheduler.schedule", "Scheduler.update_from_output", "WorkerLink.publish"} <= set(
        parts
    )
    assert result["rest_ms_per_step"] == pytest.approx(
        result["cpu_ms_per_step"] - sum(parts.values())
    )
    assert Scheduler.schedule is schedule
    assert "| 3 |" in bench.format_report([result])
