"""Optional API key: `Authorization: Bearer <key>`, compared in constant time."""

from __future__ import annotations

import hmac

from pagedserve.services.gateway.errors import APIError

# Paths answered without a key: load balancers probe /health; /metrics is open unless the
# gateway runs with --metrics-require-key, because Prometheus scrapers rarely carry secrets.
OPEN_PATHS = frozenset({"/health", "/ping"})


def is_open_path(path: str, metrics_require_key: bool) -> bool:
    return path in OPEN_PATHS or (path == "/metrics" and not metrics_require_key)


def check_api_key(authorization: str | None, api_key: str | None) -> None:
    """Raise a 401 `APIError` unless `api_key` is None (auth off) or the header carries it."""
    if api_key is None:
        return
    if not authorization:
        raise APIError(
            401,
            "missing API key: send the header `Authorization: Bearer <key>`",
            type="authentication_error",
            code="missing_api_key",
        )
    scheme, _, token = authorization.partition(" ")
    expected = api_key.encode()
    # compare_digest on bytes of any length takes time independent of where they differ.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
        raise APIError(
            401,
            "invalid API key",
            type="authentication_error",
            code="invalid_api_key",
        )
