"""The profile report's parts: py-spy's collapsed stacks into inclusive and self shares, and
CPU seconds per thread from /proc."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.profile_pipeline import (
    cpu_delta,
    frame_function,
    inclusive_shares,
    parse_collapsed,
    self_shares,
    thread_cpu_seconds,
)

RAW = [
    "main (w/__main__.py:10);step (w/runner.py:5);linear (w/prepack.py:47) 6",
    "main (w/__main__.py:10);step (w/runner.py:6);attention (w/backend.py:50) 3",
    "main (w/__main__.py:10);step (w/runner.py:5);linear (w/prepack.py:48) 1",
    "",
]


def test_collapsed_stacks_are_counted_per_stack() -> None:
    stacks = parse_collapsed(RAW)
    assert sum(stacks.values()) == 10 and len(stacks) == 3


def test_functions_are_named_without_line_numbers() -> None:
    assert frame_function("linear (services/x/prepack.py:47)") == "linear (prepack.py)"
    assert frame_function("<native>") == "<native>"


def test_shares_inclusive_and_self() -> None:
    stacks = parse_collapsed(RAW)
    inclusive = dict(inclusive_shares(stacks, top=10))
    assert inclusive["main (__main__.py)"] == 1.0 and inclusive["step (runner.py)"] == 1.0
    assert inclusive["linear (prepack.py)"] == 0.7
    assert self_shares(stacks, top=1) == [("linear (prepack.py)", 0.7)]
    assert dict(self_shares(stacks, top=10))["attention (backend.py)"] == 0.3


def test_thread_cpu_seconds_sees_a_busy_thread() -> None:
    def spin() -> None:
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    before = thread_cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin, name="spinner")
    worker.start()
    worker.join()
    # the thread has ended: measure a live one instead, this one
    spin()
    delta = cpu_delta(before, thread_cpu_seconds(os.getpid()))
    assert sum(delta.values()) >= 0.25
    assert all(v > 0 for v in delta.values())
