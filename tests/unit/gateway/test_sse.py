from __future__ import annotations

import json

from pagedserve.services.gateway.sse import SSE_DONE, sse_event


def test_event_framing():
    payload = {"text": "line one\nline two", "emoji": "🙂", "n": 1}
    event = sse_event(payload)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # newlines inside strings are escaped, one data line
    assert json.loads(event[len(b"data: ") :]) == payload
    assert "🙂".encode() in event  # UTF-8, not \\u escapes


def test_done():
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_text_with_unicode_line_breaks_stays_on_one_line():
    payload = {"choices": [{"text": "a\u2028b\x85c\u2029d\nz é"}]}
    event = sse_event(payload).decode()
    lines = event.splitlines()  # how httpx's iter_lines and many SSE clients split
    assert lines == [lines[0], ""] and lines[0].startswith("data: ")
    assert json.loads(lines[0].removeprefix("data: ")) == payload
