"""A Redis outage is the gateway's blindness, not engine death: streams open across a Redis
stall (SIGSTOP) or a Redis kill and restart outlive `engine_loss_timeout` and finish whole,
while /health answers 503 within a second."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from pagedserve.services.gateway.tokenizer import TokenizerInfo
from tests.integration.conftest import RedisServer
from tests.integration.gateway.conftest import RunningGateway, start_gateway
from tests.integration.gateway.steady_engine import SteadyEngine

pytestmark = pytest.mark.integration

ENGINE_LOSS_TIMEOUT_S = 6.0  # past the engine's republish delay after a Redis restart (<= 3 s)
STALL_S = 17.0  # past ENGINE_STATUS_TTL_S (15 s): the engine's record is stale on return
REPLY = "one two three four five six seven eight nine ten eleven twelve"
NUM_STREAMS = 3


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()  # ours alone: the tests stop and kill it
    server.start()
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.fixture
def steady(own_redis: RedisServer, info: TokenizerInfo) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        own_redis.url, info, engine=False, engine_loss_timeout=ENGINE_LOSS_TIMEOUT_S
    )
    engine = SteadyEngine(
        own_redis.url, gateway.config.namespace, info.tokenizer, reply=REPLY, token_delay_s=0.3
    )
    gateway.engine = engine.start()
    wait_for(lambda: healthy(gateway), "the gateway to see the engine live")
    yield gateway
    gateway.stop()


def wait_for(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def healthy(gateway: RunningGateway) -> bool:
    with gateway.client() as c:
        return c.get("/health").status_code == 200


class StreamReader(threading.Thread):
    """One streaming completion, read event by event in the background."""

    def __init__(self, gateway: RunningGateway, prompt: str) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.prompt = prompt
        self.events: list[dict] = []

    def run(self) -> None:
        body = {"prompt": self.prompt, "max_tokens": 200, "stream": True}
        with (
            self.gateway.client(timeout=120) as c,
            c.stream("POST", "/v1/completions", json=body) as r,
        ):
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.events.append(json.loads(line[len("data: ") :]))

    @property
    def text(self) -> str:
        return "".join(e["choices"][0]["text"] for e in self.events if e.get("choices"))

    @property
    def errors(self) -> list[dict]:
        return [e for e in self.events if "error" in e]


def start_streams(gateway: RunningGateway) -> list[StreamReader]:
    readers = [StreamReader(gateway, "count") for _ in range(NUM_STREAMS)]
    for reader in readers:
        reader.start()
    wait_for(lambda: all(r.events for r in readers), "every stream's first event")
    return readers


STALL_NOTICED_S = 1.0  # the status view notices within 0.75 s: a refresh, then a 0.5 s bound


def assert_health_is_fast_503(gateway: RunningGateway) -> None:
    """Once the gateway has had time to notice the outage, /health says so, fast."""
    time.sleep(STALL_NOTICED_S)
    with gateway.client(timeout=10) as c:
        started = time.monotonic()
        answer = c.get("/health")
        took_s = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert "Redis" in answer.json()["reason"]
    assert took_s < 1.0, f"/health took {took_s:.2f}s while Redis was out"


def assert_streams_finish_whole(readers: list[StreamReader]) -> None:
    for reader in readers:
        reader.join(timeout=90)
        assert not reader.is_alive(), "a stream never finished"
        assert reader.errors == [], reader.errors
        assert reader.text == REPLY
        assert reader.events[-1]["choices"][0]["finish_reason"] == "stop"


def test_streams_outlive_a_redis_stall(steady: RunningGateway, own_redis: RedisServer) -> None:
    readers = start_streams(steady)
    assert own_redis.process is not None
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    try:
        stalled_at = time.monotonic()
        assert_health_is_fast_503(steady)
        time.sleep(max(0.0, STALL_S - (time.monotonic() - stalled_at)))
        assert_health_is_fast_503(steady)
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)
    assert_streams_finish_whole(readers)
    wait_for(lambda: healthy(steady), "/health to recover")


def test_streams_outlive_a_redis_restart(steady: RunningGateway, own_redis: RedisServer) -> None:
    readers = start_streams(steady)
    assert own_redis.process is not None
    own_redis.process.kill()
    own_redis.process.wait()
    assert_health_is_fast_503(steady)
    time.sleep(2 * ENGINE_LOSS_TIMEOUT_S)
    assert_health_is_fast_503(steady)
    own_redis.start()  # same port, empty: the gateway queues its open requests again
    assert_streams_finish_whole(readers)
    wait_for(lambda: healthy(steady), "/health to recover")


def test_an_engine_seen_dead_while_redis_answers_still_ends_streams(
    steady: RunningGateway,
) -> None:
    readers = start_streams(steady)
    assert steady.engine is not None
    steady.engine.stop()  # silent from now on: its status record goes stale, then expires
    for reader in readers:
        reader.join(timeout=60)
        assert not reader.is_alive()
        assert [e["error"]["reason"] for e in reader.errors] == ["no_live_engine"]
