"""Server-sent events framing, as OpenAI streams it: `data: <json>\n\n`, then `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One event; compact JSON has no newline, so one `data:` line always suffices."""
    return (
        b"data: "
        + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        + (b"\n\n")
    )
