"""Graceful shutdown of one gateway replica (SIGTERM, Ctrl-C).

1. Stop accepting: every new API request gets 503 `shutting_down` (with Retry-After, so that a
   load balancer or client retries another replica) and /health answers 503 "draining".
2. Let open requests finish, up to `timeout_s`.
3. End what is still open with finish_reason "abort": each stream gets a final delta here (so
   the client sees a finished choice and `[DONE]`, even if the engine is gone), and the
   engines are told to drop the requests.
4. Only then does uvicorn stop (a second signal stops it at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import FrameType

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.errors import unavailable

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 5.0  # after aborting: how long the streams get to write their last chunk
SHUTDOWN_MESSAGE = "the server is shutting down and accepts no new requests; retry another replica"


class Drainer:
    """Refuse new work, let open streams finish, then abort the rest."""

    def __init__(self, client: EngineClient, timeout_s: float) -> None:
        if timeout_s < 0:
            raise ValueError(f"shutdown timeout must be >= 0 seconds, got {timeout_s}")
        self.client = client
        self.timeout_s = timeout_s
        self.draining = False

    async def drain(self) -> int:
        """Returns how many requests were aborted because the timeout ran out."""
        self.draining = True
        num_open = self.client.num_open_streams
        logger.info("draining: %d open request(s), waiting up to %.0f s", num_open, self.timeout_s)
        if await self._wait_closed(self.timeout_s):
            return 0
        aborted = self.client.finish_open_streams("abort", "the server shut down")
        logger.warning("shutdown timeout: aborted %d request(s)", len(aborted))
        await self.client.abort(aborted, "server shutdown")
        await self._wait_closed(ABORT_GRACE_S)
        return len(aborted)

    async def _wait_closed(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.client.num_open_streams:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True


class DrainMiddleware:
    """While draining: 503 for new API requests and for /health."""

    def __init__(self, app: ASGIApp, drainer: Drainer) -> None:
        self.app = app
        self.drainer = drainer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.drainer.draining:
            if scope["path"] == "/health":
                body = {"status": "draining", "reason": SHUTDOWN_MESSAGE}
                await JSONResponse(body, status_code=503)(scope, receive, send)
                return
            if scope["path"].startswith("/v1/"):
                refusal = unavailable(SHUTDOWN_MESSAGE, code="shutting_down")
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM/SIGINT drains before stopping."""

    def __init__(self, config: uvicorn.Config, drainer: Drainer) -> None:
        super().__init__(config)
        self.drainer = drainer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None:  # not serving yet: nothing to drain
            self.should_exit = True
            return
        if self._drain_task is not None or self.should_exit:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self.drainer.drain()
        finally:
            self.should_exit = True
