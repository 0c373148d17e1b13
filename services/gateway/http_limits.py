"""Read deadlines for uvicorn connections: no client holds a connection by sending slowly.

uvicorn closes an idle keep-alive connection, but nothing bounds a request that trickles in:
a client sending its headers one byte a second (slowloris) keeps a connection, a parser and
a buffer forever, and a few hundred such clients exhaust the gateway. So every connection
gets two deadlines, enforced by the protocol itself (the ASGI app only sees a request once
its headers are complete):

- its request's headers must be complete within `header_timeout_s` of the connection opening,
  or of the previous response finishing on a keep-alive connection, and stay under
  `MAX_HEADER_BYTES`;
- its request's body must be complete within `body_timeout_s` of the headers.

A connection past a deadline gets `408 Request Timeout` (`431` for oversized headers) if no
response has started, and is closed; the app, if it was reading the body, sees a disconnect.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024  # the request line and headers of one request
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0


def _plain_response(status: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_TIMEOUT_RESPONSE = _plain_response("408 Request Timeout", "the request was not received in time")
_HEADERS_TOO_LARGE_RESPONSE = _plain_response(
    "431 Request Header Fields Too Large", f"request headers over {MAX_HEADER_BYTES} bytes"
)


def _base_protocol() -> type:
    """uvicorn's fast parser when installed (its default), else h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def bounded_http_protocol(
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    base: type | None = None,
) -> type:
    """A uvicorn HTTP protocol class (pass as `uvicorn.Config(http=...)`) that enforces the
    read deadlines above."""
    base = base or _base_protocol()
    return type(
        f"Bounded{base.__name__}",
        (_ReadDeadlines, base),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )


class _ReadDeadlines:
    """Mixed in before a uvicorn protocol class; uses only its `transport`, `cycle`,
    `connection_made`, `data_received`, `on_response_complete` and `connection_lost`."""

    header_timeout_s: float
    body_timeout_s: float
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._deadline: asyncio.TimerHandle | None = None
        self._arm_for_next_request()

    def data_received(self, data: bytes) -> None:
        waiting_for_headers = self.cycle is self._previous_cycle
        if waiting_for_headers:
            self._num_header_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not self._previous_cycle:  # a new request's headers are in
            if waiting_for_headers:
                self._arm(self.body_timeout_s)
            if not self.cycle.more_body:  # its body too
                self._disarm()
        elif self._num_header_bytes > MAX_HEADER_BYTES:
            self._refuse(_HEADERS_TOO_LARGE_RESPONSE, "headers too large")

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm_for_next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_for_next_request(self) -> None:
        self._previous_cycle = self.cycle
        self._num_header_bytes = 0
        self._arm(self.header_timeout_s)

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(delay_s, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        what = "headers" if self.cycle is self._previous_cycle else "body"
        self._refuse(_TIMEOUT_RESPONSE, f"request {what} not complete in time")

    def _refuse(self, response: bytes, reason: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle is not self._previous_cycle
        if not (started and self.cycle.response_started):
            self.transport.write(response)
        logger.info("closing a connection: %s", reason)
        self.transport.close()
