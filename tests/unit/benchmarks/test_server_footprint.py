"""The start-up and memory sampler of the server comparisons, against a real child process
that holds a known amount of memory."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from benchmarks.server_footprint import ServerFootprint, tree_pss, tree_rss

HOLD_256_MIB = "b = bytearray(256 * 1024 * 1024); print('ready', flush=True); input()"


def test_the_peak_covers_what_a_child_holds_and_the_ready_time_is_taken() -> None:
    with ServerFootprint(interval_s=0.05) as footprint:
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD_256_MIB],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert child.stdout.readline().strip() == "ready"
            footprint.ready()
            deadline = time.monotonic() + 60
            while footprint.peak_rss < 256 * 1024**2:  # sampled in the background
                assert time.monotonic() < deadline, "the sampler never saw the child's memory"
                time.sleep(0.05)
            footprint.settled()
        finally:
            child.communicate("\n", timeout=30)
    summary = footprint.summary()
    assert summary["ready_s"] is not None and summary["ready_s"] > 0
    assert 0.25 <= summary["peak_rss_gib"] < 64
    # PSS is read later than the RSS samples (the child may have grown a page since), so
    # it is not bounded by the sampled peak: only by what the child holds
    assert 0.25 <= summary["settled_pss_gib"] < 64


def test_a_process_without_children_holds_nothing() -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as proc:
        try:
            root = psutil.Process(proc.pid)
            assert tree_rss(root) == 0 and tree_pss(root) == 0
        finally:
            proc.kill()
