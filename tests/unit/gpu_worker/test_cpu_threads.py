"""The worker's CPU thread count: the start rule, the /proc/stat arithmetic, and the governor
that re-chooses the count, on fake samples and on real CPU-bound neighbours."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from pagedserve.services.gpu_worker import cpu_threads as ct
from pagedserve.services.gpu_worker.cpu_threads import CpuSample, ThreadGovernor

TICK = os.sysconf("SC_CLK_TCK")

PROC_STAT = """cpu  900 0 100 5000 0 0 0 0 0 0
cpu0 100 10 20 1000 7 1 2 50 0 0
cpu1 300 0 40 1000 0 3 4 0 0 0
cpu2 999 0 0 1000 0 0 0 0 0 0
intr 12345
ctxt 999
"""


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_busy_seconds_counts_only_the_given_cores_and_busy_fields():
    # user + nice + system + irq + softirq; idle, iowait and steal are not busy
    assert ct.busy_seconds(PROC_STAT, {0}) == pytest.approx(133 / TICK)
    assert ct.busy_seconds(PROC_STAT, {0, 1}) == pytest.approx((133 + 347) / TICK)
    assert ct.busy_seconds(PROC_STAT, {7}) == 0.0


@pytest.mark.parametrize(
    ("others", "cores", "threads"),
    [(0.0, 2, 2), (0.3, 2, 2), (0.67, 2, 1), (1.0, 2, 1), (5.0, 2, 1), (2.6, 8, 5), (0.0, 1, 1)],
)
def test_threads_for_leaves_the_cores_others_use(others, cores, threads):
    assert ct.threads_for(others, cores) == threads


def test_other_cores_used_subtracts_our_own_cpu_time():
    before = CpuSample(at=10.0, cores_busy_s=100.0, own_s=50.0)
    after = CpuSample(at=12.0, cores_busy_s=104.0, own_s=52.0)  # 4 s busy, 2 of them ours
    assert ct.other_cores_used(before, after) == pytest.approx(1.0)
    assert ct.other_cores_used(after, after) == 0.0
    # our own time counted slightly differently from /proc/stat never gives a negative
    assert ct.other_cores_used(before, CpuSample(12.0, 101.0, 53.0)) == 0.0


def fake_samples(monkeypatch, samples):
    feed = iter(samples)
    monkeypatch.setattr(ct, "read_sample", lambda cores: next(feed))


def governor_on_two_threads(monkeypatch, samples) -> ThreadGovernor:
    """A governor of two cores, polled every second, fed `samples`, from 2 threads."""
    fake_samples(monkeypatch, samples)
    torch.set_num_threads(2)
    return ThreadGovernor(interval_s=1.0, cores={0, 1})


def test_governor_steps_down_when_others_take_a_core_and_back_up_when_they_stop(
    monkeypatch, restore_threads
):
    now = time.monotonic()
    governor = governor_on_two_threads(
        monkeypatch,
        [
            CpuSample(now - 10.0, 0.0, 0.0),
            CpuSample(now - 8.0, 4.0, 2.6),  # others: 0.7 core of 2
            CpuSample(now - 6.0, 8.0, 4.6),  # others: 1.0
            CpuSample(now - 4.0, 10.0, 6.5),  # others: 0.05
        ],
    )
    assert governor.poll() == 1
    assert torch.get_num_threads() == 1
    assert governor.poll() is None  # unchanged
    assert governor.poll() == 2
    assert torch.get_num_threads() == 2


def test_a_failed_read_keeps_the_count_and_the_window_and_the_next_read_decides(
    monkeypatch, restore_threads
):
    now = time.monotonic()
    governor = governor_on_two_threads(
        monkeypatch,
        [
            CpuSample(now - 10.0, 0.0, 0.0),
            None,  # /proc/stat unreadable for a moment
            CpuSample(now - 6.0, 8.0, 4.0),  # others: 1.0 core over the 4 s since the first
        ],
    )
    assert governor.poll() is None
    assert torch.get_num_threads() == 2
    assert governor.poll() == 1


def test_governor_waits_for_its_interval(monkeypatch, restore_threads):
    fake_samples(monkeypatch, [CpuSample(time.monotonic(), 0.0, 0.0)])  # a second read fails
    governor = ThreadGovernor(interval_s=60.0, cores={0, 1})
    assert governor.poll() is None


def test_governor_only_for_a_single_cpu_worker_whose_count_is_not_fixed(monkeypatch):
    monkeypatch.delenv("PAGEDSERVE_NUM_THREADS", raising=False)
    cpu = torch.device("cpu")
    assert ThreadGovernor.for_worker(torch.device("cuda", 0), 1) is None
    assert ThreadGovernor.for_worker(cpu, 2) is None  # TP ranks would count each other
    if ct.PROC_STAT.exists():
        assert isinstance(ThreadGovernor.for_worker(cpu, 1), ThreadGovernor)
    monkeypatch.setenv("PAGEDSERVE_NUM_THREADS", "2")
    assert ThreadGovernor.for_worker(cpu, 1) is None


def test_cpu_threads_at_start_respect_override_rank_share_and_busy_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 0.0, 0.0))
    monkeypatch.delenv("PAGEDSERVE_NUM_THREADS", raising=False)
    assert ct.cpu_threads(1) == 6  # 8 cores, 2 busy
    assert ct.cpu_threads(2) == 3
    monkeypatch.setattr(os, "getloadavg", lambda: (30.0, 0.0, 0.0))
    assert ct.cpu_threads(4) == 1  # never zero
    monkeypatch.setenv("PAGEDSERVE_NUM_THREADS", "5")
    assert ct.cpu_threads(2) == 5


@pytest.mark.skipif(not ct.PROC_STAT.exists(), reason="reads Linux's /proc/stat")
@pytest.mark.skipif(not ct.PROC_STAT.exists(), reason="governed only where /proc/stat exists")
def test_most_threads_is_every_core_for_a_governed_worker_else_the_count_set_at_start(
    monkeypatch, restore_threads
):
    """What MKL packs fp32 weights for: the most threads the worker will run with."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("PAGEDSERVE_NUM_THREADS", raising=False)
    torch.set_num_threads(1)  # the start count
    cpu = torch.device("cpu")
    assert ct.most_threads(cpu, 1) == 8  # the governor may raise the count to every core
    assert ct.most_threads(cpu, 2) == 1  # tensor-parallel ranks keep their start count
    assert ct.most_threads(torch.device("cuda", 0), 1) == 1
    monkeypatch.setenv("PAGEDSERVE_NUM_THREADS", "3")
    torch.set_num_threads(3)  # what the runner sets from it
    assert ct.most_threads(cpu, 1) == ct.most_threads(cpu, 2) == 3


def test_governor_gives_cores_back_to_real_cpu_bound_neighbours(restore_threads):
    """One `while True: pass` per core: whatever else the machine runs, the others now use
    (nearly) every core, and the governor, reading the real /proc/stat, drops to one thread."""
    cores = set(os.sched_getaffinity(0))
    torch.set_num_threads(len(cores))
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(cores))
    ]
    try:
        governor = ThreadGovernor(interval_s=1.0, cores=cores)
        deadline = time.monotonic() + 60.0
        while torch.get_num_threads() != 1 and time.monotonic() < deadline:
            governor.poll()
            time.sleep(0.1)
        assert torch.get_num_threads() == 1
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
