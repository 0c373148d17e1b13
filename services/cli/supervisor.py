"""Start, watch and stop the processes of one `pagedserve serve`.

Each child runs in its own process group (so that a terminal's Ctrl-C reaches only the
supervisor, which then stops the children in order) and is exec'd through `child_guard`, so
that the kernel kills it if the supervisor dies without cleaning up (SIGKILL included). Its
output is echoed with a `name |` prefix and the last lines are kept for the report when it
dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

NUM_TAIL_LINES = 30
PROGRESS_ECHO_INTERVAL_S = 1.0  # a progress bar redraws with \r; echo at most this often


class ChildExited(RuntimeError):
    """A child ended while it should be running."""

    def __init__(self, child: Child) -> None:
        self.child = child
        super().__init__(child.report())


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]
    ready_line: str | None = None  # a log line holding this text means the child is ready
    env: dict[str, str] | None = None  # the whole environment; None: inherit ours


@dataclass(slots=True)
class Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=NUM_TAIL_LINES))
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def report(self) -> str:
        """Name, exit status and last log lines: what a user needs when a child died."""
        code = self.proc.returncode
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return f"{self.name} (pid {self.pid}) {how}; its last log lines:\n{lines}"


class Supervisor:
    """The children of one `pagedserve serve`, in start order."""

    def __init__(self, out: TextIO = sys.stderr) -> None:
        self.out = out
        self.children: list[Child] = []
        self._out_lock = threading.Lock()

    def start(self, spec: ChildSpec) -> Child:
        guard = [
            sys.executable,
            "-P",
            "-m",
            "pagedserve.services.cli.child_guard",
            str(os.getpid()),
        ]
        proc = subprocess.Popen(
            guard + spec.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=spec.env,
            process_group=0,
        )
        child = Child(spec, proc)
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"log-{spec.name}", daemon=True
        )
        child.reader.start()
        self.children.append(child)
        return child

    def _pump(self, child: Child) -> None:
        """Echo the child's output line by line; watch for its ready line."""
        assert child.proc.stdout is not None
        buffer, last_progress = b"", 0.0
        while chunk := os.read(child.proc.stdout.fileno(), 65536):
            buffer += chunk
            while True:
                cut = min(
                    (i for i in (buffer.find(b"\n"), buffer.find(b"\r")) if i >= 0), default=-1
                )
                if cut < 0:
                    break
                line, sep, buffer = buffer[:cut], buffer[cut : cut + 1], buffer[cut + 1 :]
                text = line.decode(errors="replace").rstrip()
                if not text:
                    continue
                if sep == b"\r":  # a progress bar redrawing itself
                    if time.monotonic() - last_progress < PROGRESS_ECHO_INTERVAL_S:
                        continue
                    last_progress = time.monotonic()
                self._line(child, text)
        if buffer.strip():
            self._line(child, buffer.decode(errors="replace").rstrip())
        child.proc.stdout.close()

    def _line(self, child: Child, text: str) -> None:
        child.tail.append(text)
        if child.spec.ready_line and child.spec.ready_line in text:
            child.ready.set()
        with self._out_lock:
            print(f"{child.name:>10} | {text}", file=self.out, flush=True)

    def say(self, text: str) -> None:
        with self._out_lock:
            print(f"{'serve':>10} | {text}", file=self.out, flush=True)

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if c.poll() is not None), None)

    def restart(self, old: Child, spec: ChildSpec | None = None) -> Child:
        """Start `spec` (default: `old`'s) in the place of the exited child `old`."""
        if old.poll() is None:
            raise RuntimeError(f"{old.name} (pid {old.pid}) is still running")
        _join_reader(old)
        new = self.start(spec or old.spec)
        self.children.remove(new)
        self.children[self.children.index(old)] = new
        return new

    def reap(self, child: Child) -> None:
        """Wait for the exited child's last output, so that its report is complete."""
        child.proc.wait()
        _join_reader(child)

    def wait_until(
        self,
        what: str,
        done: Callable[[], bool],
        timeout_s: float,
        stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Poll `done` until true (True), `stop` true (False); a child exiting raises
        ChildExited, the timeout raises TimeoutError naming `what`."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if stop():
                return False
            exited = self.first_exited()
            if exited is not None:
                _join_reader(exited)
                raise ChildExited(exited)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
            time.sleep(0.1)
        return True

    def stop(self, children: Sequence[Child], timeout_s: float, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to each child's process group, wait up to `timeout_s` for them to exit,
        then SIGKILL the groups of those still running."""
        for child in children:
            _signal_group(child, sig)
        deadline = time.monotonic() + timeout_s
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late = f"{timeout_s:.0f} s after {_name(sig)}"
                self.say(f"{child.name} is still running {late}: killing it")
        for child in children:
            _signal_group(child, signal.SIGKILL)  # also reaps grandchildren left in the group
            child.proc.wait()
            _join_reader(child)

    def kill_all(self) -> None:
        """SIGKILL every child still running (and its process group)."""
        running = [c for c in reversed(self.children) if c.poll() is None]
        self.stop(running, timeout_s=0.0, sig=signal.SIGKILL)


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def _join_reader(child: Child) -> None:
    if child.reader is not None:
        child.reader.join(timeout=2)


def _name(sig: int) -> str:
    return signal.Signals(sig).name
