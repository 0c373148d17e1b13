"""Pure-ASGI middleware around every route: X-Request-Id on every response, the API key, and a
last-resort 500 in OpenAI's shape (a bug must still answer JSON, with the request id)."""

from __future__ import annotations

import logging
import re
import uuid

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedserve.services.gateway.auth import check_api_key, is_open_path
from pagedserve.services.gateway.errors import APIError

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
# Names the replica that answered, so that a client behind a load balancer can tell them apart.
GATEWAY_ID_HEADER = "x-pagedserve-gateway"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(headers: Headers) -> str:
    """The client's X-Request-Id when it is short and plain, else a fresh one."""
    given = headers.get(REQUEST_ID_HEADER, "")
    return given if _SANE_REQUEST_ID.match(given) else uuid.uuid4().hex


class GatewayMiddleware:
    def __init__(
        self, app: ASGIApp, api_key: str | None, metrics_require_key: bool, gateway_id: str = ""
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.metrics_require_key = metrics_require_key
        self.gateway_id = gateway_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request_id = request_id_of(headers)
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                raw = list(message.get("headers", []))
                raw.append((REQUEST_ID_HEADER.encode(), request_id.encode()))
                if self.gateway_id:
                    raw.append((GATEWAY_ID_HEADER.encode(), self.gateway_id.encode()))
                message = {**message, "headers": raw}
            await send(message)

        try:
            if not is_open_path(scope["path"], self.metrics_require_key):
                check_api_key(headers.get("authorization"), self.api_key)
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # gone while we read its body (or timed out): no one to answer
            return
        except APIError as exc:
            if not started:
                await exc.response()(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error in %s %s", scope.get("method"), scope["path"])
            if not started:
                error = APIError(500, "internal server error", type="server_error")
                await error.response()(scope, receive, send_with_id)
