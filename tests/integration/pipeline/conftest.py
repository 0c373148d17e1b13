"""A whole pagedserve pipeline as real processes: Redis, gateway(s), scheduler(s), worker(s),
on free loopback ports, with the tiny served model. One pipeline per test module (starting
processes that import torch costs seconds on two cores)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
import redis

from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus, RequestStatus, from_fields
from tests.integration.conftest import free_port
from tests.integration.pipeline.served_model import MAX_MODEL_LEN, build_served_model
from tests.integration.processes import (
    LIVE,
    ServiceProcess,
    gateway_process,
    scheduler_process,
    worker_process,
)

NUM_BLOCKS = 192  # per worker: 1536 tokens at the CPU default of 8 tokens per block


@dataclass
class Engine:
    engine_id: str
    scheduler: ServiceProcess
    workers: list[ServiceProcess]
    plan_port: int
    result_port: int


@dataclass
class Pipeline:
    redis_url: str
    namespace: str
    model_dir: Path
    gateway_ports: list[int] = field(default_factory=list)
    gateways: list[ServiceProcess] = field(default_factory=list)
    engines: list[Engine] = field(default_factory=list)

    @property
    def keys(self) -> RedisKeys:
        return RedisKeys(self.namespace)

    def base_url(self, gateway: int = 0) -> str:
        return f"http://127.0.0.1:{self.gateway_ports[gateway]}"

    def client(self, gateway: int = 0, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url(gateway)}/v1", api_key="unused", max_retries=0,
            timeout=60, **kwargs,
        )  # fmt: skip

    def async_client(self, gateway: int = 0) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.base_url(gateway)}/v1", api_key="unused", max_retries=0, timeout=120
        )

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def engine_status(self, engine_id: str) -> EngineStatus:
        with self.redis() as client:
            return from_fields(EngineStatus, client.hgetall(self.keys.engine(engine_id)))

    def request_status(self, request_id: str) -> RequestStatus:
        with self.redis() as client:
            return from_fields(RequestStatus, client.hgetall(self.keys.request(request_id)))

    def processes(self) -> list[ServiceProcess]:
        engines = [p for e in self.engines for p in (e.scheduler, *e.workers)]
        return [*self.gateways, *engines]

    def stop(self) -> None:
        processes = self.processes()
        for process in processes:  # all at once: each takes a second or two to exit
            process.signal(signal.SIGTERM)
        for process in processes:
            process.stop()


def add_engine(
    pipeline: Pipeline,
    engine_id: str,
    tensor_parallel_size: int = 1,
    *extra: str,
    num_blocks: int = NUM_BLOCKS,
) -> Engine:
    plan_port, result_port, master_port = free_port(), free_port(), free_port()
    scheduler = scheduler_process(
        f"scheduler-{engine_id}", pipeline.redis_url, pipeline.namespace, engine_id,
        plan_port, result_port, "--tensor-parallel-size", str(tensor_parallel_size),
        "--worker-timeout", "5", "--max-num-seqs", "64", "--max-num-batched-tokens", "512",
        *extra,
    ).start()  # fmt: skip
    workers = [
        worker_process(
            f"worker-{engine_id}-{rank}", pipeline.model_dir, plan_port, result_port,
            "--rank", str(rank), "--tensor-parallel-size", str(tensor_parallel_size),
            "--master-port", str(master_port), "--num-blocks", str(num_blocks),
            "--scheduler-timeout", "5",
        ).start()
        for rank in range(tensor_parallel_size)
    ]  # fmt: skip
    engine = Engine(engine_id, scheduler, workers, plan_port, result_port)
    pipeline.engines.append(engine)
    return engine


def add_gateway(pipeline: Pipeline, name: str, *extra: str) -> ServiceProcess:
    port = free_port()
    gateway = gateway_process(
        name, pipeline.model_dir, pipeline.redis_url, pipeline.namespace, port,
        "--max-model-len", str(MAX_MODEL_LEN), *extra,
    ).start()  # fmt: skip
    pipeline.gateway_ports.append(port)
    pipeline.gateways.append(gateway)
    return gateway


PORT_TAKEN = "address already in use"
PORT_ATTEMPTS = 3  # starts of a gateway whose port another process took first


def restart_on_another_port(pipeline: Pipeline, index: int) -> ServiceProcess:
    """Gateway `index` again, on a new free port: between `free_port()` and the gateway's
    bind, any outgoing connection on the box may take the same ephemeral port."""
    old = pipeline.gateways[index]
    args, port = list(old.args), free_port()
    args[args.index("--port") + 1] = str(port)
    old.stop()  # exited already: off the list of live services
    gateway = ServiceProcess(old.name, old.module, args, old.env).start()
    pipeline.gateway_ports[index], pipeline.gateways[index] = port, gateway
    return gateway


def wait_until_serving(pipeline: Pipeline, timeout_s: float = 120.0) -> None:
    """Every engine has attached its workers and every gateway's /health says ok (a gateway
    that lost its port to another process starts again on another)."""
    for engine in pipeline.engines:
        engine.scheduler.wait_for_log("workers ready", timeout_s)
    deadline = time.monotonic() + timeout_s
    for index in range(len(pipeline.gateways)):
        gateway, attempts = pipeline.gateways[index], 1
        while True:
            try:
                if httpx.get(f"{pipeline.base_url(index)}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if not gateway.is_alive() and PORT_TAKEN in gateway.log() and attempts < PORT_ATTEMPTS:
                gateway, attempts = restart_on_another_port(pipeline, index), attempts + 1
                continue
            if not gateway.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"gateway {gateway.name} never became healthy:\n{gateway.tail()}"
                )
            time.sleep(0.1)


@pytest.fixture(scope="session")
def served_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_served_model(tmp_path_factory.mktemp("served-model"))


@pytest.fixture(scope="session")
def reference_engine(served_model_dir: Path):
    """The in-process engine on the same model: what the pipeline must reproduce."""
    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import CacheConfig, SchedulerConfig

    return LLMEngine(
        served_model_dir,
        SchedulerConfig(max_model_len=MAX_MODEL_LEN),
        CacheConfig(num_blocks=NUM_BLOCKS),
        dtype="float32",
        device="cpu",
    )


def new_pipeline(redis_url: str, model_dir: Path) -> Pipeline:
    return Pipeline(redis_url, f"it-{uuid.uuid4().hex[:8]}", model_dir)


@pytest.fixture(scope="module")
def pipeline_factory(redis_server, served_model_dir) -> Iterator:
    started: list[Pipeline] = []

    def make() -> Pipeline:
        pipeline = new_pipeline(redis_server.url, served_model_dir)
        started.append(pipeline)
        return pipeline

    yield make
    for pipeline in started:
        pipeline.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failure, attach the tail of every live service's log to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for process in LIVE:
            report.sections.append((f"log of {process.name}", process.tail(3000)))
