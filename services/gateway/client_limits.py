"""A bound on each client's open API requests: one client (an API key, else an address)
cannot take the whole request queue. Past the bound: 429 with Retry-After.

A request is open from its first byte to its last (a stream stays open while it streams).
Clients are told apart by their bearer token when they send one (many users behind one proxy
each have a key), else by their address.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.memory_release import ReleaseMemoryMiddleware

if TYPE_CHECKING:
    from pagedserve.services.gateway.gateway_config import GatewayConfig

RETRY_AFTER_S = 1


def client_key(scope: Scope) -> str:
    """Who sent this request: a digest of its bearer token, else its address."""
    authorization = Headers(scope=scope).get("authorization", "")
    if authorization:
        return "key:" + hashlib.sha256(authorization.encode()).hexdigest()[:16]
    client = scope.get("client")
    return "addr:" + (client[0] if client else "unknown")


class ClientRequestLimit:
    """Pure-ASGI middleware: at most `limit` open /v1/ requests per client."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.num_open: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        key = client_key(scope)
        if self.num_open[key] >= self.limit:
            await self._refuse(scope, receive, send)
            return
        self.num_open[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.num_open[key] -= 1
            if self.num_open[key] <= 0:
                del self.num_open[key]

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            429,
            f"too many open requests from this client: the limit is {self.limit} at once "
            "(--max-requests-per-client); retry when one has finished",
            type="rate_limit_error",
            code="too_many_requests",
        )
        response = error.response()
        response.headers["retry-after"] = str(RETRY_AFTER_S)
        await response(scope, receive, send)


def client_limit_middleware(config: GatewayConfig) -> list[Middleware]:
    """The per-client bound (none when 0) and the memory return after big bodies."""
    limits = [Middleware(ReleaseMemoryMiddleware)]
    if config.max_requests_per_client > 0:
        limits.append(Middleware(ClientRequestLimit, limit=config.max_requests_per_client))
    return limits
