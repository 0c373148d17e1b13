"""A streaming HTTP/1.1 POST on asyncio's own streams: the benchmark client's transport.

The client runs on the box it measures. On 2 cores every CPU second it spends is taken from
the server under test, and a streamed token is an event the client must read: httpx (through
httpcore, anyio and h11) spent ~130 us of CPU on each, this reader ~50 (the same 96 requests
at 64 in flight: 0.82 against 0.30 CPU seconds a run). vLLM's serving benchmark reads its
streams with aiohttp for the same reason.

One request per connection (`Connection: close`), the body framed by chunked transfer coding,
Content-Length, or the connection's end. `http://` URLs, and `https://` with the system's CA
store (the tests exercise plain HTTP only)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

READ_SIZE = 65536  # bytes per read of a body framed by the connection's end


class MalformedResponse(Exception):
    """The server's answer is not HTTP/1.x as this reader knows it."""


@dataclass(frozen=True)
class Target:
    """Where a URL points: host, port, TLS or not, and the request line's path."""

    host: str
    port: int
    tls: bool
    path: str
    authority: str  # the Host header

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        tls = parts.scheme == "https"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, path, parts.netloc)


@dataclass
class Response:
    """A response whose head has been read; its body is read through `chunks` or `read`."""

    status: int
    headers: dict[str, str]  # names lower-cased
    reader: asyncio.StreamReader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, framing removed."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            async for chunk in _chunked_body(self.reader):
                yield chunk
        elif "content-length" in self.headers:
            remaining = _content_length(self.headers["content-length"])
            while remaining > 0:
                chunk = await self.reader.read(min(remaining, READ_SIZE))
                if not chunk:
                    raise MalformedResponse(f"connection closed {remaining} bytes early")
                remaining -= len(chunk)
                yield chunk
        else:
            while chunk := await self.reader.read(READ_SIZE):
                yield chunk

    async def read(self, limit: int) -> bytes:
        """The body's first `limit` bytes (all of it when shorter)."""
        body = b""
        async for chunk in self.chunks():
            body += chunk
            if len(body) >= limit:
                break
        return body[:limit]


@asynccontextmanager
async def post(
    url: str, body: bytes, headers: dict[str, str], connect_timeout_s: float = 30.0
) -> AsyncIterator[Response]:
    """POST `body` (JSON) to `url`; the response once its head is in. The connection is
    closed on exit."""
    target = Target.parse(url)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            target.host, target.port, ssl=ssl.create_default_context() if target.tls else None
        ),
        connect_timeout_s,
    )
    try:
        writer.write(_request_head(target, len(body), headers) + body)
        status, response_headers = await _read_head(reader)
        yield Response(status, response_headers, reader)
    finally:
        writer.close()


def _request_head(target: Target, body_length: int, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {target.path} HTTP/1.1",
        f"Host: {target.authority}",
        "Content-Type: application/json",
        "Accept: text/event-stream, application/json",
        f"Content-Length: {body_length}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status code and headers; interim (1xx) responses are skipped."""
    while True:
        status_line = (await reader.readuntil(b"\r\n")).decode("latin-1")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise MalformedResponse(f"not an HTTP/1.x status line: {status_line.strip()!r}")
        headers = await _read_headers(reader)
        if not 100 <= int(code) < 200:
            return int(code), headers


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise MalformedResponse(f"header line without a colon: {line.strip()!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


async def _chunked_body(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0], 16)
        except ValueError:
            raise MalformedResponse(f"bad chunk size line {size_line.strip()!r}") from None
        if size == 0:
            await _read_headers(reader)  # trailers, if any, up to the blank line
            return
        chunk = await reader.readexactly(size + 2)
        if chunk[-2:] != b"\r\n":
            raise MalformedResponse("a chunk does not end with CRLF")
        yield chunk[:-2]


def _content_length(value: str) -> int:
    if not value.isdigit():
        raise MalformedResponse(f"bad Content-Length {value!r}")
    return int(value)
