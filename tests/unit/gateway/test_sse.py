from __future__ import annotations

import json

from services.gateway.sse import SSE_DONE, sse_event


def test_event_framing():
    payload = {"text": "line one\nline two", "emoji": "🙂", "n": 1}
    event = sse_event(payload)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # newlines inside strings are escaped, one data line
    assert json.loads(event[len(b"data: ") :]) == payload
    assert "🙂".encode() in event  # UTF-8, not \\u escapes


def test_done():
    assert SSE_DONE == b"data: [DONE]\n\n"
