from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from pagedserve.services.gateway.errors import from_engine
from pagedserve.services.gateway.http_middleware import request_id_of
from pagedserve.shared.protocol import ERROR_ENGINE, ERROR_INVALID_REQUEST, ERROR_QUEUE_FULL


@pytest.mark.parametrize(
    ("code", "status", "error_type", "retry_after"),
    [
        (ERROR_QUEUE_FULL, 503, "service_unavailable_error", "1"),
        (ERROR_INVALID_REQUEST, 400, "invalid_request_error", None),
        (ERROR_ENGINE, 500, "server_error", None),
        (None, 500, "server_error", None),  # an engine that forgot the code: not the client's
    ],
)
def test_engine_error_codes_map_to_statuses(code, status, error_type, retry_after):
    error = from_engine("boom", code)
    assert error.status == status and error.type == error_type
    assert error.headers.get("Retry-After") == retry_after
    assert error.body()["error"]["message"] == "boom"


def test_engine_error_without_message_still_says_something():
    assert "without a message" in from_engine(None, ERROR_ENGINE).message


@pytest.mark.parametrize(
    ("given", "echoed"),
    [("abc-123_x.y:z", True), ("", False), ("has space", False), ("x" * 129, False),
     ("é", False), ("a\\r\\nInjected: 1", False)],
)  # fmt: skip
def test_request_id_echoed_only_when_sane(given, echoed):
    request_id = request_id_of(Headers({"x-request-id": given}))
    assert (request_id == given) is echoed
    assert 1 <= len(request_id) <= 128
