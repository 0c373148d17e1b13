"""A stop flag that a signal handler may raise while the main thread waits on it.

`threading.Event` is not safe for this. Its `wait()` holds the Event's internal lock on the
way in and out of every timed wait. A Python signal handler runs in the main thread, at
whatever point the main thread happens to be. If the signal lands while `wait()` holds that
lock, the handler's `set()` takes the same non-reentrant lock from the same thread and blocks
forever. Every later signal, Ctrl-C again included, then blocks on it too.

`pagedserve serve` hit this: its watch loop waits 0.2 s at a time on its stop Event, and a
SIGTERM arriving while the Event's lock was held left it hung with its children dead (found
under `timeout ... pagedserve serve` plus a `pkill`: two SIGTERMs at once).

`SignalFlag.set()` assigns a bool, which takes no lock. `wait()` sleeps in short slices and
looks at the flag between them: a signal wakes the sleep, the handler runs, and the flag is
seen at the latest one slice later.
"""

from __future__ import annotations

import time

WAIT_SLICE_S = 0.05


class SignalFlag:
    def __init__(self) -> None:
        self._raised = False

    def set(self) -> None:
        self._raised = True

    def is_set(self) -> bool:
        return self._raised

    def wait(self, timeout_s: float) -> bool:
        """True as soon as the flag is raised; False after `timeout_s` without it."""
        deadline = time.monotonic() + timeout_s
        while not self._raised:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, WAIT_SLICE_S))
        return True
