"""A real `docker-compose` deployment of compose/docker-compose.yml (CPU profile), driven from
the host: the Docker engine (installed and started when missing), the offline image build, the
project's containers, and the timings of each phase."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
DOCKERD_LOG = Path("/tmp/pagedserve-dockerd.log")
APT_PACKAGES = ["docker.io", "docker-compose", "debootstrap"]
PHASES: dict[str, float] = {}  # phase name -> seconds, printed at the end of the session
FINDINGS: list[str] = []  # what the phases measured, printed at the end of the session


def report(line: str) -> None:
    """A measured result, printed now and again in the session's closing summary."""
    FINDINGS.append(line)
    print(f"\n[compose] {line}", flush=True)


class NoDockerEngine(RuntimeError):
    """No Docker engine answers and none can be installed or started here."""


def run(argv: list[str], timeout: float = 600, check: bool = True, **kwargs: Any) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result.stdout


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 1.0) -> Any:
    """The first truthy value of `condition()`, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(every)


class phase:
    """`with phase("build"): ...` records how long the block took into PHASES."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.started = time.monotonic()
        print(f"\n[compose] phase {self.name} ...", flush=True)

    def __exit__(self, *exc: object) -> None:
        PHASES[self.name] = time.monotonic() - self.started
        print(f"[compose] phase {self.name}: {PHASES[self.name]:.1f} s", flush=True)


def docker_answers() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    )


def ensure_docker_engine() -> None:
    """Installs docker.io, docker-compose and debootstrap with apt when missing, and starts
    dockerd when no engine answers; NoDockerEngine says why when neither is possible."""
    if not all(shutil.which(tool) for tool in ("dockerd", "docker-compose", "debootstrap")):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            raise NoDockerEngine("docker.io/docker-compose/debootstrap missing and no root apt")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-q"], timeout=600, env=env)
        run(["apt-get", "install", "-y", "-q", *APT_PACKAGES], timeout=900, env=env)
    if docker_answers():
        return
    if os.geteuid() != 0:
        raise NoDockerEngine("no Docker engine answers and starting dockerd needs root")
    with DOCKERD_LOG.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    try:
        wait_for(docker_answers, 90, "dockerd to answer")
    except TimeoutError as exc:
        tail = DOCKERD_LOG.read_text(errors="replace")[-2000:]
        raise NoDockerEngine(f"dockerd did not come up: {exc}\n{tail}") from exc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Deployment:
    """One compose project (its own name, so that it never touches a user's `pagedserve`)."""

    project: str
    lb_port: int
    env: dict[str, str] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        argv = ["docker-compose", "-p", self.project, "-f", str(COMPOSE_DIR / "docker-compose.yml")]
        return run([*argv, *args], timeout=timeout, check=check, env={**os.environ, **self.env})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.lb_port}"

    def containers(self, service: str | None = None, all_states: bool = False) -> list[str]:
        labels = [f"label=com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        argv = ["docker", "ps", "-q", "--no-trunc", *(["-a"] if all_states else [])]
        for label in labels:
            argv += ["--filter", label]
        return run(argv).split()

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(run(["docker", "inspect", container]))[0]

    def healthy(self, container: str) -> bool:
        state = self.inspect(container)["State"]
        return state.get("Health", {}).get("Status") == "healthy"

    def all_healthy(self, services: dict[str, int]) -> bool:
        """Every service has its number of running containers, each healthy."""
        for service, count in services.items():
            containers = self.containers(service)
            if len(containers) != count or not all(self.healthy(c) for c in containers):
                return False
        return True

    def gateway_id_of(self, container: str) -> str | None:
        """The id the gateway in `container` announced last (it changes on every restart)."""
        logs = subprocess.run(
            ["docker", "logs", container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        ).stdout
        ids = re.findall(r"gateway (\S+) serving", logs)
        return ids[-1] if ids else None

    def crash(self, container: str) -> None:
        """SIGKILL to the container's main process, as a crash would: Docker's restart policy
        applies (`docker kill` counts as a manual stop, after which Docker restarts nothing)."""
        pid = int(self.inspect(container)["State"]["Pid"])
        if pid <= 0:
            raise RuntimeError(f"{container} is not running")
        os.kill(pid, signal.SIGKILL)  # the engine's containers are processes of this host

    def restart_count(self, container: str) -> int:
        return int(self.inspect(container)["RestartCount"])

    def queue(self) -> dict[str, Any]:
        """`pagedserve queue --json`, run inside the deployment (in the scheduler container)."""
        return json.loads(
            self.compose("exec", "-T", "scheduler-cpu", "pagedserve", "queue", "--json")
        )

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes that still carry the project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "container": run(["docker", "ps", "-aq", "--filter", label]).split(),
            "network": run(["docker", "network", "ls", "-q", "--filter", label]).split(),
            "volume": run(["docker", "volume", "ls", "-q", "--filter", label]).split(),
        }
