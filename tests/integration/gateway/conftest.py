"""A gateway under uvicorn on a free loopback port (in a thread), a real Redis, and the
scripted engine answering for the scheduler."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from pagedserve.services.gateway.app import build_app
from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from tests.integration.conftest import free_port
from tests.integration.gateway.scripted_engine import ScriptedEngine
from tests.unit.gateway.helpers import load_test_tokenizer

MODEL_NAME = "smollm2-test"
API_KEY = "sk-test-key"


@dataclass
class RunningGateway:
    config: GatewayConfig
    server: uvicorn.Server
    thread: threading.Thread
    engine: ScriptedEngine | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def client(self, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        kwargs.setdefault("timeout", 20)
        return httpx.Client(base_url=self.base_url, headers=headers, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        if self.engine is not None:
            self.engine.stop()


def start_gateway(
    redis_url: str, info: TokenizerInfo, engine: bool = True, **overrides: object
) -> RunningGateway:
    """A gateway thread; with `engine`, a scripted engine on the same namespace."""
    namespace = f"test-{uuid.uuid4().hex[:8]}"
    fields: dict[str, object] = dict(
        model="smollm2", served_model_name=MODEL_NAME, redis_url=redis_url,
        namespace=namespace, port=free_port(), api_key=API_KEY,
        gateway_id=f"gw-{uuid.uuid4().hex[:8]}", max_pending_requests=64,
    )  # fmt: skip
    fields.update(overrides)
    config = GatewayConfig(**fields)  # type: ignore[arg-type]
    client = EngineClient(
        config.redis_url,
        config.namespace,
        config.gateway_id,
        config.max_pending_requests,
        config.engine_loss_timeout,
    )
    app = build_app(config, info, client)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    scripted = ScriptedEngine(redis_url, namespace, info.tokenizer).start() if engine else None
    return RunningGateway(config, server, thread, scripted)


@pytest.fixture(scope="session")
def info() -> TokenizerInfo:
    return load_test_tokenizer()


@pytest.fixture
def gateway(redis_url: str, info: TokenizerInfo) -> Iterator[RunningGateway]:
    running = start_gateway(redis_url, info)
    yield running
    running.stop()
