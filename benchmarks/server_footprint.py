"""What a server costs beside its speed: seconds from launch until it answers /health, and the
peak memory of its whole process tree while it starts and serves.

Memory is the server's process tree: every descendant of this process (the benchmark's own
process is left out). Its RSS, summed as `ps` would show it, is sampled every `interval_s`
from a background thread and the peak kept (a spike shorter than the interval can be
missed). Its PSS (each shared page divided among the processes that map it, so a library
loaded by three processes is counted once) is read once, when the caller says the work is
done (`settled()`): reading it walks every mapping of a process, ~20 ms for a 1 GiB one, and
holds the process's memory-map lock, so sampling it while serving would slow the server
measured.

    with ServerFootprint() as footprint, Server(...) as server:
        footprint.ready()
        ...serve...
        footprint.settled()
    footprint.summary() -> {"ready_s": ..., "peak_rss_gib": ..., "settled_pss_gib": ...}
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import psutil

GIB = 1024**3


GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


def _tree_sum(root: psutil.Process, measure: Callable[[psutil.Process], int]) -> int:
    """`measure` summed over `root`'s descendants; one that exits meanwhile counts 0."""
    total = 0
    for child in root.children(recursive=True):
        with contextlib.suppress(*GONE):
            total += measure(child)
    return total


def tree_rss(root: psutil.Process) -> int:
    """Bytes resident, summed over `root`'s descendants."""
    return _tree_sum(root, lambda p: p.memory_info().rss)


def tree_pss(root: psutil.Process) -> int:
    """Proportional set size in bytes, summed over `root`'s descendants (RSS where the kernel
    does not expose PSS)."""

    def pss(process: psutil.Process) -> int:
        info = process.memory_full_info()
        return getattr(info, "pss", info.rss)

    return _tree_sum(root, pss)


class ServerFootprint:
    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak_rss = 0
        self.settled_pss: int | None = None
        self.ready_s: float | None = None
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True)
        self._root = psutil.Process()

    def __enter__(self) -> Self:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def ready(self) -> None:
        """The server answers /health now: its start-up time is taken."""
        self.ready_s = time.perf_counter() - self._started

    def settled(self) -> None:
        """The server has done its work: its PSS is read now, once."""
        self.settled_pss = tree_pss(self._root)

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss(self._root))
            self._stop.wait(self.interval_s)

    def summary(self) -> dict[str, Any]:
        pss = None if self.settled_pss is None else self.settled_pss / GIB
        return {
            "ready_s": self.ready_s,
            "peak_rss_gib": self.peak_rss / GIB,
            "settled_pss_gib": pss,
        }
