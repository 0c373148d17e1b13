from __future__ import annotations

import pytest

from benchmarks.pipeline_overhead import compare, mean_of_runs


def _run(duration_s: float, num_steps: int) -> dict:
    return {
        "duration_s": duration_s,
        "num_steps": num_steps,
        "num_output_tokens": 1000,
        "output_throughput": 1000 / duration_s,
        "step_ms": 1000 * duration_s / num_steps,
    }


def test_two_in_process_runs_average_and_report_their_spread() -> None:
    merged = mean_of_runs(_run(9.0, 100), _run(11.0, 102))
    assert merged["duration_s"] == pytest.approx(10.0)
    assert merged["output_throughput"] == pytest.approx(100.0)
    assert merged["step_ms"] == pytest.approx(1000 * 10.0 / 101)
    assert merged["noise"] == pytest.approx(0.2)
    assert merged["runs_output_throughput"] == pytest.approx([1000 / 9, 1000 / 11])


def test_overhead_per_step_and_per_token() -> None:
    inproc = _run(10.0, 100)  # 100 ms per step
    pipe = {"output_throughput": 80.0, "step_ms": 125.0, "duration_s": 12.5}
    overhead = compare(inproc, pipe)
    assert overhead["throughput_loss"] == pytest.approx(0.2)
    assert overhead["extra_ms_per_step"] == pytest.approx(25.0)
    assert overhead["extra_ms_per_token"] == pytest.approx(2.5)  # 2.5 s over 1000 tokens
