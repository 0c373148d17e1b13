"""Server-sent events framing, as OpenAI streams it: `data: <json>\n\n`, then `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream"


# Characters that JSON leaves raw under ensure_ascii=False but that many clients' line
# splitters (Python's str.splitlines, httpx's iter_lines) take for line breaks, cutting an
# event in two. JSON's own escapes keep the text the same for every decoder.
_LINE_BREAKS_JSON_KEEPS = str.maketrans(
    {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def sse_event(payload: dict[str, Any]) -> bytes:
    """One event on one `data:` line: compact JSON has no raw newline, and the other
    characters that clients split lines on are escaped."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + text.translate(_LINE_BREAKS_JSON_KEEPS).encode() + b"\n\n"
