"""Building blocks of the reliability tests: engines and gateways with chosen flags, streaming
clients that record exactly what a user sees, and waits with bounds."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from tests.integration.conftest import free_port
from tests.integration.pipeline.conftest import NUM_BLOCKS, Engine, Pipeline
from tests.integration.pipeline.served_model import MAX_MODEL_LEN
from tests.integration.processes import (
    ServiceProcess,
    gateway_process,
    scheduler_process,
    worker_process,
)

PROMPTS = [
    "Paged attention stores",
    "The quick brown fox",
    "Continuous batching adds",
    "Once upon a time there",
]


def scheduler_args(extra: tuple[str, ...]) -> list[str]:
    return ["--worker-timeout", "5", "--max-num-seqs", "64",
            "--max-num-batched-tokens", "512", *extra]  # fmt: skip


def start_scheduler(pipeline: Pipeline, engine: Engine, *extra: str) -> ServiceProcess:
    return scheduler_process(
        f"scheduler-{engine.engine_id}", pipeline.redis_url, pipeline.namespace,
        engine.engine_id, engine.plan_port, engine.result_port, *scheduler_args(extra),
    ).start()  # fmt: skip


def start_worker(
    pipeline: Pipeline, engine: Engine, num_blocks: int, *extra: str
) -> ServiceProcess:
    worker = worker_process(
        f"worker-{engine.engine_id}-{len(engine.workers)}", pipeline.model_dir,
        engine.plan_port, engine.result_port, "--num-blocks", str(num_blocks),
        "--scheduler-timeout", "5", *extra,
    ).start()  # fmt: skip
    engine.workers.append(worker)
    return worker


def add_engine(
    pipeline: Pipeline,
    engine_id: str,
    *scheduler_extra: str,
    num_blocks: int = NUM_BLOCKS,
    worker_extra: tuple[str, ...] = (),
) -> Engine:
    """One scheduler and one worker on fresh loopback ports."""
    engine = Engine(engine_id, None, [], free_port(), free_port())  # type: ignore[arg-type]
    engine.scheduler = start_scheduler(pipeline, engine, *scheduler_extra)
    start_worker(pipeline, engine, num_blocks, *worker_extra)
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


def health(pipeline: Pipeline, gateway: int = 0) -> int:
    try:
        return httpx.get(f"{pipeline.base_url(gateway)}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


@dataclass
class StreamResult:
    """What one streaming client saw."""

    status: int = 0
    pieces: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    error: dict | None = None  # the error body (before headers) or error event (after)
    done: bool = False  # got `data: [DONE]`
    num_completion_tokens: int | None = None
    elapsed_s: float = 0.0
    first_piece_at: float | None = None  # monotonic time of the first text

    @property
    def text(self) -> str:
        return "".join(self.pieces)


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, body: dict, result: StreamResult | None = None
) -> StreamResult:
    """POST a streaming completion and record each text piece, the finish reason, any error,
    and the usage; never raises for HTTP-level failures (they are in the result)."""
    result = result or StreamResult()
    start = time.monotonic()
    payload = {"stream": True, "stream_options": {"include_usage": True}, **body}
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=payload) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = json.loads(await response.aread())
                return result
            async for line in response.aiter_lines():
                _on_sse_line(result, line)
    except httpx.HTTPError as exc:
        result.error = {"error": {"message": f"transport: {exc!r}", "type": "transport"}}
    finally:
        result.elapsed_s = time.monotonic() - start
    return result


def _on_sse_line(result: StreamResult, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[len("data: ") :]
    if data == "[DONE]":
        result.done = True
        return
    event = json.loads(data)
    if "error" in event:
        result.error = event
        return
    if event.get("usage"):
        result.num_completion_tokens = event["usage"]["completion_tokens"]
    for choice in event.get("choices", []):
        if choice.get("text"):
            if result.first_piece_at is None:
                result.first_piece_at = time.monotonic()
            result.pieces.append(choice["text"])
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
