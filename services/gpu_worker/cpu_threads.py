"""How many OpenMP threads a CPU worker computes with, chosen at start and chosen again while
it serves, from how much CPU the machine's other processes use.

OpenMP threads spin-wait for each other at every op: on a core another process keeps busy, a
thread that loses its core stalls its siblings. Measured on the 2-core dev box (AVX2 caps, fp32,
a decode step of 16 sequences): idle, 2 threads take 129 ms against 177 ms for 1; beside one
`while True: pass`, 2 threads take 438 ms against 171 ms for 1. Neither count is right for
long: a box that was busy when the worker started (a model download, a test run) may be idle a
minute later, and the other way round.

`ThreadGovernor` therefore samples, every `interval_s`, the CPU time of this process and of
the cores it may run on (`/proc/stat`, per core of its affinity set, so a container's cpuset
is honoured) and sets torch's thread count to the cores the others leave free:

    others = (busy time of our cores - our own CPU time) / elapsed      (in cores)
    threads = clamp(cores - round(others), 1, cores)

A CPU-bound neighbour shows as about 2/3 of a core while it shares two cores with our two
threads, so it is rounded up to a whole core and we step down; the gateway, the scheduler and
Redis, at a few percent of a core while serving, round to nothing and leave us every core.
`PAGEDSERVE_NUM_THREADS` fixes the count and turns the governor off. Where `/proc/stat` does
not exist (macOS), the count chosen at start stays.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user, nice, system, irq, softirq (guest is inside user)


def fixed_threads() -> int | None:
    """`PAGEDSERVE_NUM_THREADS`, when set."""
    override = os.environ.get("PAGEDSERVE_NUM_THREADS")
    return max(1, int(override)) if override else None


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_threads(world_size: int) -> int:
    """The count at start: `PAGEDSERVE_NUM_THREADS`, else this rank's share of the cores that
    are idle now (cores already busy by the 1-minute load average are not counted)."""
    fixed = fixed_threads()
    if fixed is not None:
        return fixed
    num_cores = usable_cores()
    idle = num_cores - int(os.getloadavg()[0])
    return max(1, min(num_cores, idle) // world_size)


def is_governed(device: torch.device, world_size: int) -> bool:
    """A `ThreadGovernor` re-chooses the count: a single CPU worker whose count is not fixed,
    on a system with /proc/stat (not a GPU, nor tensor-parallel ranks, which would count each
    other as "others")."""
    return (
        device.type == "cpu"
        and world_size == 1
        and fixed_threads() is None
        and hasattr(os, "sched_getaffinity")
        and PROC_STAT.exists()
    )


def most_threads(device: torch.device, world_size: int) -> int:
    """The most threads the worker will ever run with: every usable core where the governor
    may raise the count to them, else the count set at start. MKL's fp32 weight packing is
    made for this many (see `cpu_prepack`)."""
    return usable_cores() if is_governed(device, world_size) else torch.get_num_threads()


def threads_for(other_cores: float, num_cores: int) -> int:
    """The cores left to us when other processes use `other_cores` of `num_cores`."""
    return max(1, min(num_cores, num_cores - round(other_cores)))


@dataclass(frozen=True, slots=True)
class CpuSample:
    at: float  # monotonic seconds
    cores_busy_s: float  # busy seconds of the cores we may run on, every process
    own_s: float  # this process's CPU seconds, every thread


def busy_seconds(proc_stat: str, cores: set[int]) -> float:
    """Busy seconds of `cores` from the text of /proc/stat (its `cpuN` lines)."""
    ticks = 0
    for line in proc_stat.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            fields = rest.split()
            ticks += sum(int(fields[i]) for i in BUSY_FIELDS)
    return ticks / os.sysconf("SC_CLK_TCK")


def read_sample(cores: set[int]) -> CpuSample | None:
    try:
        text = PROC_STAT.read_text()
    except OSError:
        return None
    own = os.times()
    return CpuSample(time.monotonic(), busy_seconds(text, cores), own.user + own.system)


def other_cores_used(before: CpuSample, after: CpuSample) -> float:
    """Cores' worth of CPU the other processes used between two samples."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        return 0.0
    others = (after.cores_busy_s - before.cores_busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / elapsed)


class ThreadGovernor:
    """Re-chooses torch's CPU thread count every `interval_s` (see the module's note). Call
    `poll()` between steps and while idle; it reads /proc/stat only once an interval is up."""

    def __init__(self, interval_s: float = 2.0, cores: set[int] | None = None) -> None:
        self.interval_s = interval_s
        self.cores = cores if cores is not None else set(os.sched_getaffinity(0))
        self.last = read_sample(self.cores)

    @classmethod
    def for_worker(cls, device: torch.device, world_size: int) -> ThreadGovernor | None:
        """A governor where the worker's count is governed (`is_governed`); None otherwise."""
        return cls() if is_governed(device, world_size) else None

    def poll(self) -> int | None:
        """Sets and returns the new thread count when it changed, else None."""
        if self.last is None or time.monotonic() - self.last.at < self.interval_s:
            return None
        sample = read_sample(self.cores)
        if sample is None:
            return None
        others = other_cores_used(self.last, sample)
        elapsed_s = sample.at - self.last.at  # longer than the interval after a long step
        self.last = sample
        threads = threads_for(others, len(self.cores))
        current = torch.get_num_threads()
        if threads == current:
            return None
        torch.set_num_threads(threads)
        logger.info(
            "CPU threads %d -> %d: other processes used %.2f of %d cores over the last %.1f s",
            current,
            threads,
            others,
            len(self.cores),
            elapsed_s,
        )
        return threads
