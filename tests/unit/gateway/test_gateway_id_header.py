"""Every response names the gateway replica that produced it (X-Pagedserve-Gateway), so that a
client or a test behind the load balancer can tell the replicas apart."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pagedserve.services.gateway.http_middleware import GATEWAY_ID_HEADER, GatewayMiddleware


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def _client(gateway_id: str, api_key: str | None = None) -> TestClient:
    app = Starlette(
        routes=[Route("/v1/models", _hello)],
        middleware=[
            Middleware(
                GatewayMiddleware, api_key=api_key, metrics_require_key=False, gateway_id=gateway_id
            )
        ],
    )
    return TestClient(app)


def test_response_names_the_replica() -> None:
    response = _client("gw-replica-2").get("/v1/models")
    assert response.status_code == 200
    assert response.headers[GATEWAY_ID_HEADER] == "gw-replica-2"


def test_errors_name_the_replica_too() -> None:
    response = _client("gw-a", api_key="secret").get("/v1/models")
    assert response.status_code == 401
    assert response.headers[GATEWAY_ID_HEADER] == "gw-a"


def test_no_header_without_an_id() -> None:
    assert GATEWAY_ID_HEADER not in _client("").get("/v1/models").headers
