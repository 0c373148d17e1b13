"""`pagedserve queue` with no flags finds the local `pagedserve serve` from its discovery file;
stale files are ignored, several deployments are listed or picked by --port, and a runtime
directory that others could write is refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from pagedserve.services.cli import main
from pagedserve.services.cli.discovery import (
    Deployment,
    DiscoveryError,
    announce,
    live_deployments,
    process_start_time,
    runtime_dir,
)
from pagedserve.shared.keys import RedisKeys


@pytest.fixture(autouse=True)
def private_runtime(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    for name in ("REDIS_URL", "PAGEDSERVE_REDIS_URL", "PAGEDSERVE_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def other_process() -> Iterator[int]:
    """A second live pid, standing in for a second serve."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def deployment(pid: int, port: int, redis_url: str = "redis://127.0.0.1:1/0", **kw) -> Deployment:
    start_time = kw.pop("start_time", None) or process_start_time(pid)
    assert start_time is not None
    return Deployment(pid, start_time, [port], redis_url, kw.get("namespace", "ns"), "smollm2")


def test_the_file_is_private_and_queue_reads_that_deployment(redis_server, capsys) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.xadd(RedisKeys("found").requests, {"m": b"x"})
    client.close()
    path = announce(deployment(os.getpid(), 8000, redis_server.url, namespace="found"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(runtime_dir().stat().st_mode) == 0o700
    assert main(["queue", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stream"]["length"] == 1


def test_a_dead_or_reused_pid_is_stale_and_its_file_removed() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [
        announce(Deployment(dead.pid, 1, [8000], "redis://x:1/0", "ns", "m")),
        announce(deployment(os.getpid(), 8001, start_time=1)),  # our pid, another start time
    ]
    assert live_deployments() == []
    assert not any(path.exists() for path in stale)


def test_several_are_listed_and_port_picks_one(other_process: int, capsys) -> None:
    announce(deployment(os.getpid(), 8000, "redis://127.0.0.1:1/0"))
    announce(deployment(other_process, 9000, "redis://127.0.0.1:2/0"))
    assert main(["queue"]) == 1
    err = capsys.readouterr().err
    assert "2 local pagedserve serve deployments run" in err and "pick one with --port" in err
    assert f"port 8000 (pid {os.getpid()}" in err and f"port 9000 (pid {other_process}" in err
    assert main(["queue", "--port", "9000"]) == 1  # picked: its Redis (port 2) is unreachable
    assert "cannot reach Redis at redis://127.0.0.1:2/0" in capsys.readouterr().err
    assert main(["queue", "--port", "7000"]) == 1
    assert "no local pagedserve serve on port 7000" in capsys.readouterr().err
    assert main(["queue", "--list", "--json"]) == 0
    assert [d["ports"] for d in json.loads(capsys.readouterr().out)] == [[8000], [9000]]


def test_an_explicit_redis_url_wins_over_discovery(capsys) -> None:
    announce(deployment(os.getpid(), 8000, "redis://127.0.0.1:2/0"))
    assert main(["queue", "--redis-url", "redis://127.0.0.1:3/0"]) == 1
    assert "redis://127.0.0.1:3/0" in capsys.readouterr().err


def test_a_directory_others_can_enter_is_refused(capsys) -> None:
    announce(deployment(os.getpid(), 8000))
    runtime_dir().chmod(0o755)
    with pytest.raises(DiscoveryError, match="open to other users"):
        live_deployments()
    assert main(["queue"]) == 1
    assert "open to other users (mode 755)" in capsys.readouterr().err
