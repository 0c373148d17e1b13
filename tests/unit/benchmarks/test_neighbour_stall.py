"""The bursty-neighbour benchmark's arithmetic and its neighbour, really run."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.neighbour_stall import expected_step_ms, neighbour_source, summarize


def test_the_neighbour_takes_about_its_duty_of_a_core() -> None:
    proc = subprocess.Popen([sys.executable, "-c", neighbour_source(5.0, 20.0)])
    try:
        watched = psutil.Process(proc.pid)
        time.sleep(0.5)  # started
        before, wall = sum(watched.cpu_times()[:2]), time.monotonic()
        time.sleep(2.0)
        share = (sum(watched.cpu_times()[:2]) - before) / (time.monotonic() - wall)
    finally:
        proc.kill()
        proc.wait()
    assert 0.1 < share < 0.5  # 0.25 asked; a loaded box stretches the sleeps, not the spins


def test_a_burst_must_fit_in_its_period() -> None:
    with pytest.raises(ValueError, match="burst"):
        neighbour_source(10.0, 10.0)


def test_the_expectation_spreads_the_neighbours_cpu_over_the_threads() -> None:
    assert expected_step_ms(100.0, 0.2, 2) == pytest.approx(100.0 / 0.9)
    assert expected_step_ms(100.0, 0.2, 1) == pytest.approx(125.0)


def test_the_summary_compares_each_batch_with_its_expectation() -> None:
    steps = {"alone": {8: [10.0, 12.0, 11.0]}, "beside": {8: [15.0, 14.0, 16.0]}}
    (row,) = summarize(steps, duty=0.2, threads=2)
    assert row["alone_ms"] == 11.0 and row["beside_ms"] == 15.0
    assert row["slowdown"] == pytest.approx(15 / 11)
    assert row["stall"] == pytest.approx(15 / (11 / 0.9))
