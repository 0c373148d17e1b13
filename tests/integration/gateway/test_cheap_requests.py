"""Cheap requests stay cheap, against a real gateway process: a huge prompt is refused before
tokenizing with little memory, slow clients are cut off, and one request or one client
cannot ask for unbounded work."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.conftest import free_port
from tests.integration.processes import ServiceProcess, gateway_process, wait_for

pytestmark = pytest.mark.integration

MAX_MODEL_LEN = 8192  # SmolLM2's own
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_REQUESTS_PER_CLIENT = 3
BIG_PROMPT_CHARS = 8 * 1024 * 1024 - 1024  # ~8 MB: just under the body limit
MAX_RSS_GROWTH = 100 * 1024 * 1024


class Gateway:
    def __init__(self, process: ServiceProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, info) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("model")
    info.tokenizer.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": MAX_MODEL_LEN}))
    return path


@pytest.fixture(scope="module")
def gateway(model_dir: Path, redis_server) -> Iterator[Gateway]:  # type: ignore[no-untyped-def]
    port = free_port()
    process = gateway_process(
        "gw-cheap", model_dir, redis_server.url, f"cheap-{uuid.uuid4().hex[:6]}", port,
        "--header-timeout", HEADER_TIMEOUT_S, "--body-timeout", BODY_TIMEOUT_S,
        "--max-requests-per-client", MAX_REQUESTS_PER_CLIENT,
    ).start()  # fmt: skip
    running = Gateway(process, port)
    try:
        process.wait_for_log("serving", timeout_s=120)
        wait_for("the gateway to answer", lambda: _answers(running), timeout_s=60)
        yield running
    finally:
        process.stop()


def _answers(gateway: Gateway) -> bool:
    try:
        with gateway.client(timeout=2) as c:
            return c.get("/health").status_code in (200, 503)
    except httpx.TransportError:
        return False


class RssPeak(threading.Thread):
    """Samples a process's RSS until stopped; keeps the highest."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.peak = gateway.rss()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.005):
            self.peak = max(self.peak, self.gateway.rss())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def test_huge_prompts_are_refused_before_tokenizing(gateway: Gateway) -> None:
    with gateway.client() as c:  # warm: the first big body sizes the allocator's arenas
        c.post("/v1/completions", json={"prompt": "x" * BIG_PROMPT_CHARS})
    baseline = gateway.rss()
    sampler = RssPeak(gateway)
    sampler.start()
    answers: list[httpx.Response] = []

    def send() -> None:
        with gateway.client() as c:
            answers.append(c.post("/v1/completions", json={"prompt": "y" * BIG_PROMPT_CHARS}))

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=60)
    peak = sampler.stop()
    assert len(answers) == 3
    for answer in answers:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "prompt" and "leaves no room" in error["message"]
        assert f"maximum context length of {MAX_MODEL_LEN} tokens" in error["message"]
    growth = peak - baseline
    assert growth < MAX_RSS_GROWTH, f"RSS grew {growth / 2**20:.0f} MiB"


def test_huge_chat_message_is_refused_before_tokenizing(gateway: Gateway) -> None:
    body = {"messages": [{"role": "user", "content": "z" * BIG_PROMPT_CHARS}]}
    with gateway.client() as c:
        answer = c.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "messages" and "leaves no room" in error["message"]


def test_body_over_the_limit_is_413(gateway: Gateway) -> None:
    with gateway.client() as c:
        answer = c.post("/v1/completions", json={"prompt": "x" * (9 * 1024 * 1024)})
    assert answer.status_code == 413
    assert "request body too large" in answer.json()["error"]["message"]


def test_too_many_sequences_in_one_request(gateway: Gateway) -> None:
    body = {"prompt": [f"p{i}" for i in range(64)], "n": 16, "max_tokens": 1}
    with gateway.client() as c:
        answer = c.post("/v1/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "n"
    assert "64 prompt(s) x n=16 = 1024 sequences; the limit is 256" in error["message"]


def _slowloris(port: int, stop: threading.Event, closed: list[float]) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(0.2)
        for byte in b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 10_000:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(4096) == b"":
                    break
            except TimeoutError:
                continue  # nothing to read yet: keep trickling
            except OSError:
                break
        closed.append(time.monotonic() - started)


def test_slow_headers_are_cut_off(gateway: Gateway) -> None:
    stop, closed = threading.Event(), []
    clients = [
        threading.Thread(target=_slowloris, args=(gateway.port, stop, closed), daemon=True)
        for _ in range(50)
    ]
    for client in clients:
        client.start()
    try:
        with gateway.client(timeout=5) as c:  # meanwhile others are served
            assert c.get("/health").status_code in (200, 503)
        wait_for("every slow connection to be closed", lambda: len(closed) == 50, 30)
    finally:
        stop.set()
    assert min(closed) >= HEADER_TIMEOUT_S * 0.9


def test_slow_body_is_cut_off(gateway: Gateway) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head + b"content-length: 1000\r\n\r\n" + b'{"prompt": "')
        sock.settimeout(BODY_TIMEOUT_S * 10)
        started = time.monotonic()
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        took_s = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert took_s >= BODY_TIMEOUT_S * 0.9


def _held_request(port: int) -> socket.socket:
    """A request that waits for an engine that never answers, until its socket is closed."""
    body = json.dumps({"prompt": "hold", "max_tokens": 1}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def test_a_client_over_its_open_request_bound_gets_429(gateway: Gateway) -> None:
    held = [_held_request(gateway.port) for _ in range(MAX_REQUESTS_PER_CLIENT)]
    try:
        with gateway.client() as c:
            wait_for("the bound to be reached", lambda: _is_429(c), timeout_s=30)
            answer = c.get("/v1/models")
            assert answer.status_code == 429
            assert answer.headers["retry-after"] == "1"
            assert f"the limit is {MAX_REQUESTS_PER_CLIENT} at once" in answer.text
    finally:
        for sock in held:
            sock.close()  # the clients leave: their requests end and free their slots
    with gateway.client() as c:
        wait_for("a slot to free up", lambda: c.get("/v1/models").status_code == 200, 30)


def _is_429(client: httpx.Client) -> bool:
    return client.get("/v1/models").status_code == 429
