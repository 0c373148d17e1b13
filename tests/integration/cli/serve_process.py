"""`pagedserve serve` run as a user runs it: a subprocess on free ports, its output in a file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pagedserve.services.cli.ports import free_port_run

REPO_ROOT = Path(__file__).resolve().parents[3]
# The console script that `pip install` puts next to the interpreter: what users run.
PAGEDSERVE = str(Path(sys.executable).parent / "pagedserve")
# a line of Redis's own: its prefixed output, or its log lines serve repeats when it dies
REDIS_LINE = re.compile(r"\s*(redis \||\d+:[CMSX] \d)")


class ServeProcess:
    def __init__(self, *argv: str) -> None:
        # up to four gateways (`--num-gateways`) take the ports from here up
        self.port = free_port_run(4)
        self.argv = [PAGEDSERVE, "serve", "--port", str(self.port), *argv]
        self.log_path = Path(tempfile.mkstemp(prefix="pagedserve-serve-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None
        self.child_pids: set[int] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("REDIS_URL", None)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def services_log_tail(self, num_chars: int = 12_000) -> str:
        """The end of the log without Redis's own lines (its start-up banner, repeated when
        serve reports its death, fills a short tail): what a failed assertion shows."""
        lines = [line for line in self.log().splitlines() if not REDIS_LINE.match(line)]
        return "\n".join(lines)[-num_chars:]

    def wait_ready(self, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while "serve | ready:" not in self.log():
            assert self.proc is not None and self.proc.poll() is None, f"serve died:\n{self.log()}"
            assert time.monotonic() < deadline, f"serve not ready in {timeout_s} s:\n{self.log()}"
            time.sleep(0.2)
        self.child_pids = self.descendants()
        assert httpx.get(f"{self.base_url}/health", timeout=10).status_code == 200

    def redis_args(self) -> list[str]:
        match = re.search(r"pagedserve queue --redis-url (\S+) --namespace (\S+)", self.log())
        assert match, self.log()
        return ["--redis-url", match[1], "--namespace", match[2]]

    def queue_json(self) -> dict:
        out = subprocess.run(
            [PAGEDSERVE, "queue", "--json", *self.redis_args()],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    def descendants(self) -> set[int]:
        """Every live process below serve, from /proc."""
        assert self.proc is not None
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        found, frontier = set(), {self.proc.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
            found |= frontier
        return found

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        """Test clean-up: nothing may survive, whatever state the test left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for pid in self.child_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.log_path.unlink(missing_ok=True)


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
