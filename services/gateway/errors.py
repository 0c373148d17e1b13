"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, with a status.

Everything the gateway refuses is an `APIError`; the app turns it into a JSON response (or, once
a stream's headers are out, into a final SSE event) so that bad input is never a 500.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from pagedserve.shared.protocol import ERROR_ENGINE, ERROR_INVALID_REQUEST, ERROR_QUEUE_FULL

RETRY_AFTER_S = 1  # what a refused client is told to wait before retrying
ERROR_NO_LIVE_ENGINE = "no_live_engine"  # the gateway gave up waiting for any engine: 503


class APIError(Exception):
    """A request the gateway answers with an error body instead of a completion."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """OpenAI's shape with vLLM's integer `code` (the HTTP status); `reason` keeps our
        finer word for it (queue_full, no_live_engine, model_not_found, ...)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
                "reason": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def unavailable(message: str, code: str = "service_unavailable") -> APIError:
    """A retryable refusal: 503 with Retry-After."""
    return APIError(
        503,
        message,
        type="service_unavailable_error",
        code=code,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def from_engine(error: str | None, error_code: str | None) -> APIError:
    """The HTTP answer to a TokenDelta that finished with "error"."""
    message = error or "the engine failed the request without a message"
    if error_code in (ERROR_QUEUE_FULL, ERROR_NO_LIVE_ENGINE):
        return unavailable(message, code=error_code)
    if error_code == ERROR_INVALID_REQUEST:
        return APIError(400, message, code=ERROR_INVALID_REQUEST)
    # ERROR_ENGINE and anything unknown: not the client's fault.
    return APIError(500, message, type="server_error", code=error_code or ERROR_ENGINE)
