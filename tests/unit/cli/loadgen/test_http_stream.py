"""The benchmark client's HTTP/1.1 transport and `send_request` against a scripted server on
loopback: each test says what bytes the server answers, and what the client makes of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from pagedserve.services.cli.loadgen import http_stream
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig, send_request
from pagedserve.services.cli.loadgen.workload import BenchRequest

REQUEST = BenchRequest(prompt="one two three", prompt_token_ids=[1, 2, 3], output_len=2)


def sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def chunked(*parts: bytes) -> bytes:
    body = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts)
    return body + b"0\r\n\r\n"


TOKEN = {"choices": [{"index": 0, "text": " x", "finish_reason": None}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


class ScriptedServer:
    """Answers every connection with `answer` (after reading the request), then closes; keeps
    what each request sent."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        self.requests.append((head, await reader.readexactly(length)))
        writer.write(self.answer)
        await writer.drain()
        writer.close()


@asynccontextmanager
async def scripted(answer: bytes) -> AsyncIterator[tuple[ScriptedServer, EndpointConfig]]:
    script = ScriptedServer(answer)
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield script, EndpointConfig(f"http://127.0.0.1:{port}/v1", "m", api_key="k")
    finally:
        server.close()
        await server.wait_closed()


def run_request(answer: bytes, timeout_s: float = 30.0):
    async def go():
        async with scripted(answer) as (script, endpoint):
            return script, await send_request(endpoint, REQUEST, timeout_s)

    return asyncio.run(go())


def test_a_chunked_stream_is_read_event_by_event_and_the_request_is_sent_whole() -> None:
    # one event split across two chunks, two events in one: framing is not the events' own
    stream = sse(TOKEN, TOKEN, USAGE)
    body = chunked(stream[:10], stream[10:40], stream[40:])
    script, record = run_request(STREAM_HEAD + b"transfer-encoding: chunked\r\n\r\n" + body)
    assert record.error is None
    assert len(record.chunk_times) == 2
    assert record.num_output_tokens == 2
    head, sent = script.requests[0]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in head
    assert json.loads(sent)["max_tokens"] == 2 and json.loads(sent)["stream"] is True


def test_content_length_and_connection_end_framing_and_interim_responses() -> None:
    stream = sse(TOKEN, TOKEN, USAGE)
    length = b"content-length: %d\r\n\r\n" % len(stream)
    for answer in (
        STREAM_HEAD + length + stream,
        STREAM_HEAD + b"\r\n" + stream,  # no framing: the body ends with the connection
        b"HTTP/1.1 100 Continue\r\n\r\n" + STREAM_HEAD + length + stream,
    ):
        _, record = run_request(answer)
        assert record.error is None, answer[:60]
        assert record.num_output_tokens == 2


def test_an_error_status_is_recorded_with_the_start_of_its_body() -> None:
    detail = json.dumps({"error": {"message": "max_tokens is too large"}}).encode()
    answer = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(detail) + detail
    _, record = run_request(answer)
    assert record.error is not None
    assert record.error.startswith("StreamError: HTTP 400:")
    assert "max_tokens is too large" in record.error


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"garbage\r\n\r\n", "MalformedResponse"),
        (STREAM_HEAD + b"bad header\r\n\r\n", "MalformedResponse"),
        (STREAM_HEAD + b"transfer-encoding: chunked\r\n\r\nzz\r\n", "MalformedResponse"),
        # the connection ends mid-chunk, and mid-length
        (STREAM_HEAD + b"transfer-encoding: chunked\r\n\r\n40\r\ndata: {", "IncompleteReadError"),
        (STREAM_HEAD + b"content-length: 400\r\n\r\ndata: {", "MalformedResponse"),
        # a header line longer than the reader's 64 KiB buffer
        (STREAM_HEAD + b"x-long: " + b"a" * 70_000 + b"\r\n\r\n", "LimitOverrunError"),
    ],
)
def test_broken_answers_are_recorded_as_failures_not_raised(answer: bytes, error: str) -> None:
    _, record = run_request(answer)
    assert record.error is not None and record.error.startswith(error), record.error


def test_a_server_that_never_answers_times_out_as_a_recorded_failure() -> None:
    async def go():
        async def silent(reader, writer):
            await reader.read(1 << 16)
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoint = EndpointConfig(f"http://127.0.0.1:{port}", "m")
        try:
            return await send_request(endpoint, REQUEST, timeout_s=0.2)
        finally:
            server.close()

    record = asyncio.run(go())
    assert record.error is not None and record.error.startswith("TimeoutError")


def test_a_refused_connection_is_a_recorded_failure() -> None:
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there now
        return await send_request(EndpointConfig(f"http://127.0.0.1:{port}", "m"), REQUEST)

    record = asyncio.run(go())
    assert record.error is not None and record.error.startswith("ConnectionRefusedError")


def test_targets() -> None:
    target = http_stream.Target.parse("https://example.org/v1/completions?x=1")
    assert (target.host, target.port, target.tls, target.path) == (
        "example.org", 443, True, "/v1/completions?x=1",
    )  # fmt: skip
    assert http_stream.Target.parse("http://[::1]:8000").port == 8000
    with pytest.raises(ValueError, match="http:// or https://"):
        http_stream.Target.parse("ftp://example.org/")
