"""Start pagedserve services as real subprocesses for integration tests.

Each service runs in its own session (process group) with its output in a log file; `stop()`
sends SIGTERM to the whole group, then SIGKILL if it lingers, so no child survives a test run.
Every live `ServiceProcess` is registered, so that a failing test can show their logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LIVE: list[ServiceProcess] = []


class ServiceProcess:
    def __init__(self, name: str, module: str, args: Sequence[str], env: dict | None = None):
        self.name = name
        self.module = module
        self.args = [str(a) for a in args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log_path = Path(tempfile.mkstemp(prefix=f"pagedserve-{name}-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", self.module, *self.args],
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        LIVE.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for_log(self, text: str, timeout_s: float = 60.0, after: int = 0) -> None:
        """Wait until `text` appears in the log (past character `after`)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log()[after:]:
            if not self.is_alive():
                raise RuntimeError(f"{self.name} exited before logging {text!r}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name} did not log {text!r} in {timeout_s}s:\n{self.tail()}"
                )
            time.sleep(0.05)

    def tail(self, num_chars: int = 4000) -> str:
        return self.log()[-num_chars:]

    def signal(self, sig: int) -> None:
        """Send `sig` to the service's whole process group."""
        if self.is_alive():
            os.killpg(self.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL it after `timeout_s`; returns the exit code."""
        if self.process is None:
            return None
        if self.is_alive():
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                print(f"{self.name} ignored SIGTERM for {timeout_s}s; killing it", file=sys.stderr)
                self.signal(signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # children that outlived their parent
            os.killpg(self.pid, signal.SIGKILL)
        if self in LIVE:
            LIVE.remove(self)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the group at once (a crash, for failure tests)."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
        if self in LIVE:
            LIVE.remove(self)


def scheduler_process(
    name: str, redis_url: str, namespace: str, engine_id: str, plan_port: int,
    result_port: int, *extra: str, env: dict | None = None,
) -> ServiceProcess:  # fmt: skip
    args = ["--redis-url", redis_url, "--namespace", namespace, "--engine-id", engine_id,
            "--plan-port", plan_port, "--result-port", result_port, *extra]  # fmt: skip
    return ServiceProcess(name, "pagedserve.services.scheduler", args, env)


def worker_process(
    name: str, model_dir: Path, plan_port: int, result_port: int, *extra: str,
    env: dict | None = None,
) -> ServiceProcess:  # fmt: skip
    args = ["--model", model_dir, "--plan-port", plan_port, "--result-port", result_port,
            "--device", "cpu", "--dtype", "float32", *extra]  # fmt: skip
    # One torch thread per worker: the test machine's cores are shared by every process.
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    return ServiceProcess(name, "pagedserve.services.gpu_worker", args, env)


def gateway_process(
    name: str, model_dir: Path, redis_url: str, namespace: str, port: int, *extra: str
) -> ServiceProcess:
    args = ["--model", model_dir, "--redis-url", redis_url, "--namespace", namespace,
            "--port", port, "--gateway-id", name, *extra]  # fmt: skip
    return ServiceProcess(name, "pagedserve.services.gateway", args)


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float) -> float:
    """Poll until `condition()`; returns the seconds it took, fails past `timeout_s`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s}s")
        time.sleep(0.1)
    return time.monotonic() - start
