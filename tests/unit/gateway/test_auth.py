from __future__ import annotations

import hmac

import pytest

from pagedserve.services.gateway import auth
from pagedserve.services.gateway.auth import check_api_key, is_open_path
from pagedserve.services.gateway.errors import APIError


def test_auth_off_accepts_anything():
    check_api_key(None, None)
    check_api_key("Bearer whatever", None)


def test_right_key():
    check_api_key("Bearer sk-123", "sk-123")
    check_api_key("bearer sk-123", "sk-123")


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Bearer sk-12", "invalid_api_key"),
        ("Bearer sk-1234", "invalid_api_key"),
        ("Basic sk-123", "invalid_api_key"),
        ("sk-123", "invalid_api_key"),
    ],
)
def test_wrong_or_missing_key_is_a_401_in_openai_shape(header, code):
    with pytest.raises(APIError) as info:
        check_api_key(header, "sk-123")
    error = info.value
    assert error.status == 401
    assert error.body() == {
        "error": {
            "message": error.message, "type": "authentication_error", "param": None, "code": 401,
            "reason": code,
        }
    }  # fmt: skip


def test_compare_is_constant_time(monkeypatch):
    calls = []
    original = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    check_api_key("Bearer sk-123", "sk-123")
    assert calls == [(b"sk-123", b"sk-123")]


def test_open_paths():
    assert is_open_path("/health", metrics_require_key=True)
    assert is_open_path("/metrics", metrics_require_key=False)
    assert not is_open_path("/metrics", metrics_require_key=True)
    assert not is_open_path("/v1/models", metrics_require_key=False)
