"""Processes that spin on the CPU beside a test, so that it proves its bounds on a loaded
machine (issue 13: "passes while two CPU-burning processes run beside it"). Each burner stops
by itself after `duration_s` even if the test runner dies, and is killed when the test ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "import time\nend = time.monotonic() + {duration}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def cpu_burners(num: int = 2, duration_s: float = 300.0) -> Iterator[list[subprocess.Popen]]:
    """`num` processes each keeping one core busy for at most `duration_s` seconds."""
    burners = [
        subprocess.Popen([sys.executable, "-c", SPIN.format(duration=duration_s)])
        for _ in range(num)
    ]
    try:
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
