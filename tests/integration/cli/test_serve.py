"""`pagedserve serve` end to end, as a user runs it: a subprocess on free ports with a tiny
model (and, marked slow, the default model), health, a streamed chat completion,
`pagedserve queue --json` while requests run, SIGTERM in the middle of a stream (the stream
ends with finish_reason "abort" and [DONE]), and no process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import RedisServer
from tests.integration.cli.serve_process import (
    PAGEDSERVE,
    ServeProcess,
    group_exists,
    is_alive,
)
from tests.integration.pipeline.served_model import build_served_model

pytestmark = pytest.mark.integration
SERVE_FLAGS = ["--kv-cache-memory", "4000000", "--max-model-len", "256", "--device", "cpu"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_served_model(tmp_path_factory.mktemp("served-model"))


@pytest.fixture
def serve_factory() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.kill()


class Stream:
    """A streamed chat completion in a thread: its SSE payloads, as they arrive."""

    def __init__(self, base_url: str, content: str, max_tokens: int) -> None:
        self.events: list[str] = []
        self.error: BaseException | None = None
        body = {"messages": [{"role": "user", "content": content}], "stream": True,
                "max_tokens": max_tokens, "ignore_eos": True}  # fmt: skip
        self.thread = threading.Thread(target=self._run, args=(base_url, body), daemon=True)
        self.thread.start()

    def _run(self, base_url: str, body: dict) -> None:
        try:
            with (
                httpx.Client(base_url=base_url, timeout=60) as client,
                client.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                response.raise_for_status()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
        except BaseException as exc:
            self.error = exc

    @property
    def response_id(self) -> str | None:
        return json.loads(self.events[0])["id"] if self.events else None

    def finish_reasons(self) -> list[str]:
        return [
            choice["finish_reason"]
            for event in self.events
            if event != "[DONE]"
            for choice in json.loads(event)["choices"]
            if choice["finish_reason"]
        ]

    def text(self) -> str:
        return "".join(
            choice["delta"].get("content") or ""
            for event in self.events
            if event != "[DONE]"
            for choice in json.loads(event)["choices"]
        )


def assert_nothing_left(serve: ServeProcess) -> None:
    assert serve.child_pids, "serve started no children?"
    deadline = time.monotonic() + 5
    while any(is_alive(pid) for pid in serve.child_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in serve.child_pids if is_alive(pid)], serve.log()
    assert not [pid for pid in serve.child_pids if group_exists(pid)]  # grandchildren too


@pytest.mark.slow
def test_serve_stream_queue_and_drain(model_dir: Path, serve_factory) -> None:
    serve = ServeProcess("--model", str(model_dir), "--shutdown-timeout", "0", *SERVE_FLAGS)
    serve_factory.append(serve.start())
    serve.wait_ready()
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in serve.child_pids]
    for program in (
        b"pagedserve.services.scheduler",
        b"pagedserve.services.gpu_worker",
        b"pagedserve.services.gateway",
        b"redis",
    ):
        assert any(program in command for command in commands), (program, commands)
    socket_dir = _private_socket_dir(commands)
    found = _queue_without_redis_flags(serve)  # the discovery file leads `queue` to serve
    assert found.returncode == 0 and "engines" in json.loads(found.stdout), found.stderr

    # A plain streamed chat completion.
    first = Stream(serve.base_url, "Hello there", 8)
    first.thread.join(timeout=60)
    assert first.error is None and first.events[-1] == "[DONE]"
    assert first.finish_reasons() == ["length"] and first.text()

    # `pagedserve queue --json` while requests run shows them. A fast CPU serves the tiny
    # model's 220 tokens in well under the second a `queue` process takes to start, so streams
    # are started afresh until a snapshot catches some in flight.
    streams: list[Stream] = []
    seen_ids: set[str] = set()
    # Generous: each `queue` call starts a Python process, slow on a loaded 2-core box (a
    # 60 s bound ran out there before the streams' requests were queued).
    deadline = time.monotonic() + 300
    while not seen_ids and time.monotonic() < deadline:
        if not any(stream.thread.is_alive() for stream in streams):
            streams += [Stream(serve.base_url, f"story {i}", 220) for i in range(3)]
        snapshot = serve.queue_json()
        seen_ids = {r["request_id"] for r in snapshot["in_flight"]}
    assert seen_ids, "queue never showed a request in flight"
    assert snapshot["stream"]["pending"] >= 1
    (engine,) = snapshot["engines"]
    assert engine["alive"] and engine["workers_alive"]
    assert [g["alive"] for g in snapshot["gateways"]] == [True]
    for stream in streams:
        stream.thread.join(timeout=120)
        assert stream.error is None and stream.finish_reasons() == ["length"]
    # Engine request ids are `<response id>-<choice index>`: the queue showed our requests.
    response_ids = {s.response_id for s in streams}
    assert {rid.rsplit("-", 1)[0] for rid in seen_ids} <= response_ids, (seen_ids, response_ids)

    # SIGTERM in the middle of a stream: it ends coherently, then everything exits.
    victim = Stream(serve.base_url, "a long story", 230)
    deadline = time.monotonic() + 30
    while len(victim.events) < 3 and time.monotonic() < deadline:  # role chunk + tokens
        time.sleep(0.01)
    serve.signal(signal.SIGTERM)
    victim.thread.join(timeout=30)
    assert victim.error is None, victim.error
    assert victim.finish_reasons() == ["abort"], victim.events[-3:]
    assert victim.events[-1] == "[DONE]"
    assert serve.wait(timeout_s=60) == 0, serve.log()
    assert "stopped" in serve.log().splitlines()[-1]
    assert_nothing_left(serve)
    assert not socket_dir.exists()
    gone = _queue_without_redis_flags(serve)
    assert gone.returncode == 1 and f"no local pagedserve serve on port {serve.port}" in gone.stderr


def _queue_without_redis_flags(serve: ServeProcess) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PAGEDSERVE_REDIS_URL")}
    return subprocess.run(
        [PAGEDSERVE, "queue", "--port", str(serve.port), "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def _private_socket_dir(commands: list[bytes]) -> Path:
    """The scheduler and workers meet on ipc:// sockets in one 0700 directory, not on TCP."""
    addresses = set()
    for command in commands:
        argv = command.split(b"\0")
        if b"pagedserve.services.scheduler" in argv or b"pagedserve.services.gpu_worker" in argv:
            assert b"--plan-port" not in argv and b"--result-port" not in argv, argv
            addresses.add(argv[argv.index(b"--plan-address") + 1].decode())
    (address,) = addresses
    assert address.startswith("ipc://"), address
    socket_dir = Path(address.removeprefix("ipc://")).parent
    assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    return socket_dir


@pytest.mark.slow
def test_a_dead_worker_is_restarted_and_a_crash_loop_stops_everything(
    model_dir: Path, serve_factory
) -> None:
    """Also the path with a Redis of the user's (--redis-url): serve must leave it running."""
    with RedisServer(free_port()) as redis_server:
        serve = ServeProcess("--model", str(model_dir), "--redis-url", redis_server.url,
                             "--namespace", "mine", *SERVE_FLAGS)  # fmt: skip
        serve_factory.append(serve.start())
        serve.wait_ready()
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in serve.child_pids]
        assert not any(b"redis-server" in command for command in commands)
        assert serve.redis_args() == ["--redis-url", redis_server.url, "--namespace", "mine"]
        first_worker = _worker_pid(serve)
        os.kill(first_worker, signal.SIGKILL)
        _wait_for_log(serve, "restarted worker0 (pid")
        log = serve.log()
        assert f"worker0 (pid {first_worker}) was killed by signal 9" in log
        assert "its last log lines:" in log and "worker 0 ready" in log
        _wait_for_health(serve)  # until the new worker attached, new requests get a 503
        after = Stream(serve.base_url, "after the restart", 6)  # served by the new worker
        after.thread.join(timeout=180)
        assert after.error is None and after.finish_reasons() == ["length"], after.events[-2:]
        metrics = httpx.get(f"{serve.base_url}/metrics", timeout=10).text
        assert 'pagedserve:process_restarts_total{process="worker0"} 1.0' in metrics
        _kill_worker_until_serve_gives_up(serve)
        client = redis.Redis.from_url(redis_server.url)
        assert client.ping()  # not ours to stop
        client.close()


def _worker_pid(serve: ServeProcess) -> int:
    for pid in serve.descendants():
        with contextlib.suppress(OSError):
            if b"pagedserve.services.gpu_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"no worker running:\n{serve.log()}")


def _wait_for_health(serve: ServeProcess, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{serve.base_url}/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, f"/health not 200 within {timeout_s} s:\n{serve.log()}"
        time.sleep(0.5)


def _wait_for_log(serve: ServeProcess, text: str, count: int = 1, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while serve.log().count(text) < count:
        assert serve.proc is not None and serve.proc.poll() is None, serve.log()
        assert time.monotonic() < deadline, f"no {text!r} x{count} in:\n{serve.log()}"
        time.sleep(0.1)


def _kill_worker_until_serve_gives_up(serve: ServeProcess) -> None:
    """Four more deaths within 60 s make five: a crash loop, and serve stops (exit 1)."""
    for restarts in range(2, 6):
        serve.child_pids |= serve.descendants()
        os.kill(_worker_pid(serve), signal.SIGKILL)
        if restarts < 5:
            _wait_for_log(serve, "restarted worker0 (pid", count=restarts)
    assert serve.wait(timeout_s=90) == 1
    assert "worker0 died 5 times within 60 s: a crash loop" in serve.log()
    assert_nothing_left(serve)


@pytest.mark.slow
def test_default_model_serves_a_chat_completion(serve_factory) -> None:
    """The real user path: `pagedserve serve` with no model flag (SmolLM2-135M, converted once
    into the cache)."""
    serve = ServeProcess("--kv-cache-memory", "32000000", "--shutdown-timeout", "5")
    serve_factory.append(serve.start())
    serve.wait_ready(timeout_s=600)
    from openai import OpenAI

    client = OpenAI(base_url=f"{serve.base_url}/v1", api_key="unused")
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12, temperature=0, stream=True,
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    serve.signal(signal.SIGINT)  # Ctrl-C
    assert serve.wait(timeout_s=60) == 0
    assert_nothing_left(serve)
