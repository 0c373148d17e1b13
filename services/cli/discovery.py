"""How `pagedserve queue` finds the `pagedserve serve` deployments running on this machine.

Each serve, once ready, writes `serve-<pid>.json` (mode 0600: it names a private Redis) into a
per-user runtime directory (mode 0700): `$XDG_RUNTIME_DIR/pagedserve`, else
`/tmp/pagedserve-<uid>`. It holds the serve's pid and that process's start time, its gateway
port(s), Redis URL and namespace, and is removed when serve stops. A file whose process is gone
(serve was SIGKILLed) or whose pid now belongs to another process is stale: ignored, and
removed when found. A directory that is not ours or that others can enter is refused, since
another user could otherwise plant a file that points `queue` at their Redis.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path


class DiscoveryError(RuntimeError):
    """No unique deployment, or an unsafe runtime directory."""


@dataclass(frozen=True)
class Deployment:
    pid: int
    start_time: int  # the process's start time in clock ticks since boot (/proc/<pid>/stat)
    ports: list[int]
    redis_url: str
    namespace: str
    model: str

    def describe(self) -> str:
        ports = ",".join(str(p) for p in self.ports)
        label = "ports" if len(self.ports) > 1 else "port"
        return f"{label} {ports} (pid {self.pid}, model {self.model}, namespace {self.namespace})"


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "pagedserve"
    return Path("/tmp") / f"pagedserve-{os.getuid()}"


def _private_dir(create: bool) -> Path | None:
    path = runtime_dir()
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise DiscoveryError(f"{path} is not a directory of this user: not using it")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise DiscoveryError(f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o})")
    return path


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when no such process runs (a zombie is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def announce(deployment: Deployment) -> Path:
    """Write this deployment's file (0600); return its path for `withdraw`."""
    directory = _private_dir(create=True)
    assert directory is not None
    path = directory / f"serve-{deployment.pid}.json"
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(deployment), out)
    os.replace(temporary, path)
    return path


def withdraw(path: Path) -> None:
    path.unlink(missing_ok=True)


def live_deployments() -> list[Deployment]:
    """Every local serve whose file is current, by port; stale files are removed."""
    directory = _private_dir(create=False)
    if directory is None:
        return []
    found = []
    for path in sorted(directory.glob("serve-*.json")):
        try:
            deployment = Deployment(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if process_start_time(deployment.pid) == deployment.start_time:
            found.append(deployment)
        else:
            withdraw(path)
    return sorted(found, key=lambda d: d.ports)


def choose(deployments: list[Deployment], port: int | None) -> Deployment | None:
    """The deployment serving `port` (or the only one); None when none runs."""
    if port is not None:
        matching = [d for d in deployments if port in d.ports]
        if not matching:
            listed = "; ".join(d.describe() for d in deployments) or "none"
            raise DiscoveryError(f"no local pagedserve serve on port {port} (running: {listed})")
        return matching[0]
    if len(deployments) > 1:
        listed = "\n  ".join(d.describe() for d in deployments)
        raise DiscoveryError(
            f"{len(deployments)} local pagedserve serve deployments run:\n  {listed}\n"
            "pick one with --port (or give --redis-url)"
        )
    return deployments[0] if deployments else None
