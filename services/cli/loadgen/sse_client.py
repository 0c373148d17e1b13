"""A streaming OpenAI client for benchmarks: one request, its SSE events, its timings.

It speaks to any OpenAI-compatible server (ours, vLLM, TGI, ...): `/v1/completions` or
`/v1/chat/completions` with `stream: true` and `stream_options.include_usage`, plus vLLM's
`ignore_eos` extension so that outputs have exactly `max_tokens` tokens. Its transport is
`http_stream`: a light reader on asyncio's own streams, since the client shares the box with
the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pagedserve.services.cli.loadgen import http_stream
from pagedserve.services.cli.loadgen.latency_stats import RequestRecord
from pagedserve.services.cli.loadgen.workload import BenchRequest

DONE = object()  # the `data: [DONE]` sentinel


class StreamError(RuntimeError):
    """The server answered with an error status or an error event mid-stream."""


@dataclass(frozen=True)
class EndpointConfig:
    base_url: str  # e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str
    endpoint: str = "completions"  # "completions" | "chat"
    api_key: str | None = None
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")

    @property
    def root(self) -> str:
        """The server's address without a trailing `/v1`: where /health and /metrics are."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    @property
    def url(self) -> str:
        path = "/v1/completions" if self.endpoint == "completions" else "/v1/chat/completions"
        return self.root + path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, request: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.output_len,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = request.output_len  # servers without ignore_eos honour this
        if self.endpoint == "completions":
            body["prompt"] = request.prompt
        else:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        return body


_SSE_LINE_END = re.compile(rb"\r\n|\r|\n")


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an SSE stream as the SSE spec splits them: at CR, LF or CRLF only (not
    also at U+2028, U+0085..., as `str.splitlines` does, which servers may send raw inside
    JSON strings, cutting an event in two)."""
    pending = b""
    async for chunk in chunks:
        *lines, pending = _SSE_LINE_END.split(pending + chunk)
        for line in lines:
            yield line.decode("utf-8", errors="replace")
    if pending:
        yield pending.decode("utf-8", errors="replace")


def parse_sse_line(line: str) -> Any:
    """One line of an SSE stream -> its JSON payload, `DONE`, or None (blank, comment, or a
    field other than `data`)."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == "[DONE]":
        return DONE
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise StreamError(f"malformed SSE data {data[:80]!r}: {exc}") from exc


def chunk_text(event: dict[str, Any]) -> str:
    """The generated text one event carries ("" for role, usage or finish-only chunks)."""
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


def apply_event(event: Any, record: RequestRecord, now: float) -> bool:
    """Record one parsed event; True when the stream is over."""
    if event is None:
        return False
    if event is DONE:
        return True
    if "error" in event:
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise StreamError(f"error event: {message}")
    if chunk_text(event):
        record.chunk_times.append(now)
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        record.num_output_tokens = int(usage["completion_tokens"])
    return False


@asynccontextmanager
async def open_stream(
    endpoint: EndpointConfig, request: BenchRequest
) -> AsyncIterator[AsyncIterator[str]]:
    """Send one streaming request; the SSE lines of its answer (StreamError unless 200)."""
    body = json.dumps(endpoint.body(request)).encode()
    async with http_stream.post(endpoint.url, body, endpoint.headers) as response:
        if response.status != 200:
            detail = (await response.read(300)).decode(errors="replace")
            raise StreamError(f"HTTP {response.status}: {detail}")
        yield sse_lines(response.chunks())


TRANSPORT_ERRORS = (OSError, EOFError, asyncio.LimitOverrunError, http_stream.MalformedResponse)
"""What a request may fail with besides StreamError: connection errors and timeouts
(TimeoutError is an OSError), a connection closed mid-body, an over-long line, a garbled
response."""


async def send_request(
    endpoint: EndpointConfig, request: BenchRequest, timeout_s: float = 600.0
) -> RequestRecord:
    """Stream one request to completion, within `timeout_s` in all; failures are recorded,
    never raised."""
    record = RequestRecord(request.prompt_len, request.output_len)
    record.start_time = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s), open_stream(endpoint, request) as lines:
            async for line in lines:
                if apply_event(parse_sse_line(line), record, time.perf_counter()):
                    break
        if record.num_output_tokens == 0:  # a server that sent no usage block
            record.num_output_tokens = len(record.chunk_times)
    except (StreamError, *TRANSPORT_ERRORS) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.end_time = time.perf_counter()
    return record
