"""The gateway's graceful shutdown: refuse new work with 503, let open streams finish within the
shutdown timeout, abort the rest with finish_reason "abort" and a coherent end of stream."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from pagedserve.services.gateway.app import build_app
from pagedserve.services.gateway.drain import Drainer, DrainingServer
from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from tests.integration.conftest import free_port
from tests.integration.gateway.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.integration


@dataclass
class DrainingGateway:
    server: DrainingServer
    thread: threading.Thread
    engine: ScriptedEngine
    base_url: str

    def stream(self, content: str, max_tokens: int, out: list[str]) -> threading.Thread:
        """Stream a chat completion in a thread, appending each SSE data payload to `out`."""

        def run() -> None:
            body = {"messages": [{"role": "user", "content": content}], "stream": True,
                    "max_tokens": max_tokens}  # fmt: skip
            with (
                httpx.Client(base_url=self.base_url, timeout=30) as client,
                client.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                out.extend(
                    line.removeprefix("data: ")
                    for line in response.iter_lines()
                    if line.startswith("data: ")
                )

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def start_gateway(
    redis_url: str, info: TokenizerInfo, shutdown_timeout: float, token_delay_s: float
) -> DrainingGateway:
    namespace = f"drain-{uuid.uuid4().hex[:8]}"
    config = GatewayConfig(
        model="smollm2", redis_url=redis_url, namespace=namespace, port=free_port(),
        gateway_id=f"gw-{uuid.uuid4().hex[:8]}", shutdown_timeout=shutdown_timeout,
    )  # fmt: skip
    client = EngineClient(redis_url, namespace, config.gateway_id, 64)
    drainer = Drainer(client, config.shutdown_timeout)
    app = build_app(config, info, client, drainer)
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning"), drainer
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the gateway did not start"
        time.sleep(0.02)
    engine = ScriptedEngine(redis_url, namespace, info.tokenizer, token_delay_s=token_delay_s)
    return DrainingGateway(server, thread, engine.start(), f"http://127.0.0.1:{config.port}")


@pytest.fixture
def gateways(redis_url: str, info: TokenizerInfo) -> Iterator[list[DrainingGateway]]:
    started: list[DrainingGateway] = []
    yield started
    for gateway in started:
        gateway.server.should_exit = gateway.server.force_exit = True
        gateway.thread.join(timeout=10)
        gateway.engine.stop()


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def finish_reasons(events: list[str]) -> list[str]:
    reasons = []
    for event in events:
        if event != "[DONE]":
            reasons += [
                c["finish_reason"] for c in json.loads(event)["choices"] if c["finish_reason"]
            ]
    return reasons


def test_open_stream_past_the_timeout_ends_with_abort(gateways, redis_url, info) -> None:
    gateway = start_gateway(redis_url, info, shutdown_timeout=0.5, token_delay_s=0.005)
    gateways.append(gateway)
    events: list[str] = []
    streamer = gateway.stream("[hang] never answered", 8, events)
    wait_for(lambda: len(gateway.engine.received) == 1)

    started = time.monotonic()
    gateway.server.handle_exit(signal.SIGTERM, None)
    wait_for(lambda: gateway.server.drainer.draining)
    with httpx.Client(base_url=gateway.base_url, timeout=10) as client:
        hello = {"messages": [{"role": "user", "content": "hi"}]}
        refused = client.post("/v1/chat/completions", json=hello)
        health = client.get("/health")
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["reason"] == "shutting_down"
    assert "shutting down" in refused.json()["error"]["message"]
    assert health.status_code == 503 and health.json()["status"] == "draining"

    streamer.join(timeout=10)
    assert not streamer.is_alive()
    assert finish_reasons(events) == ["abort"]
    assert events[-1] == "[DONE]"
    request_id = gateway.engine.received[0].request_id
    wait_for(lambda: any(request_id in a.request_ids for _, a in gateway.engine.aborts))
    gateway.thread.join(timeout=10)
    assert not gateway.thread.is_alive()  # the server stopped once drained
    assert 0.5 <= time.monotonic() - started < 8


def test_stream_within_the_timeout_finishes_normally(gateways, redis_url, info) -> None:
    gateway = start_gateway(redis_url, info, shutdown_timeout=20, token_delay_s=0.05)
    gateways.append(gateway)
    events: list[str] = []
    streamer = gateway.stream("tell me", 6, events)
    wait_for(lambda: len(events) >= 2)  # role chunk + a first token: mid-stream

    gateway.server.handle_exit(signal.SIGTERM, None)
    streamer.join(timeout=15)
    assert finish_reasons(events) == ["length"]
    assert events[-1] == "[DONE]"
    gateway.thread.join(timeout=10)
    assert not gateway.thread.is_alive()
    assert gateway.engine.aborts == []


def test_second_signal_stops_at_once(gateways, redis_url, info) -> None:
    gateway = start_gateway(redis_url, info, shutdown_timeout=60, token_delay_s=0.005)
    gateways.append(gateway)
    events: list[str] = []
    gateway.stream("[hang] forever", 8, events)
    wait_for(lambda: len(gateway.engine.received) == 1)
    gateway.server.handle_exit(signal.SIGTERM, None)
    wait_for(lambda: gateway.server.drainer.draining)
    gateway.server.handle_exit(signal.SIGINT, None)
    gateway.thread.join(timeout=10)
    assert not gateway.thread.is_alive()


def test_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="shutdown_timeout must be >= 0, got -1"):
        GatewayConfig(shutdown_timeout=-1)
