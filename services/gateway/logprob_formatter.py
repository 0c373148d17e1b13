"""Token logprobs in OpenAI's two shapes.

Completions (`logprobs: k`): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
parallel arrays, each top entry a `{token text: logprob}` dict holding the sampled token and
the k best (as vLLM does). Chat (`logprobs: true, top_logprobs: k`): `{"content": [{"token",
"logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI-compatible servers clamp like this


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token: its text, logprob, alternatives and where its text starts."""

    token: str
    logprob: float
    top: list[tuple[str, float]]  # best first, may include the sampled token
    text_offset: int


def clamp(logprob: float) -> float:
    if math.isnan(logprob) or logprob < MIN_LOGPROB:
        return MIN_LOGPROB
    return logprob


def completion_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    top_logprobs = []
    for entry in entries:
        top = {entry.token: clamp(entry.logprob)}
        for token, logprob in entry.top:
            top.setdefault(token, clamp(logprob))
        top_logprobs.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [clamp(e.logprob) for e in entries],
        "top_logprobs": top_logprobs,
        "text_offset": [e.text_offset for e in entries],
    }


def _chat_item(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": clamp(logprob), "bytes": list(token.encode())}


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    content = []
    for entry in entries:
        item = _chat_item(entry.token, entry.logprob)
        item["top_logprobs"] = [_chat_item(token, logprob) for token, logprob in entry.top]
        content.append(item)
    return {"content": content}
