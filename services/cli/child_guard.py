"""`python -m pagedserve.services.cli.child_guard PARENT_PID PROGRAM ARGS...`: exec PROGRAM so
that the kernel kills it when its parent dies, even by SIGKILL.

The supervisor starts every child through this shim instead of a `preexec_fn`, which is
unsafe in a process with threads (its log readers). PR_SET_PDEATHSIG survives `execve`, so
the real program inherits it; the parent-pid check closes the race in which the parent died
before `prctl` ran.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send `sig` when the parent dies; False where prctl is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(
            "usage: python -m pagedserve.services.cli.child_guard PARENT_PID PROGRAM [ARGS...]",
            file=sys.stderr,
        )
        return 2
    parent_pid, program = int(argv[0]), argv[1:]
    set_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent is already gone
        return 1
    os.execvp(program[0], program)
    return 127  # unreachable: execvp raises on failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
