"""How a chat request's output is rendered, chosen once when the request is parsed
(`tool_calls.read_tools`) and handed through to the formatter:

- `PlainText`: the text is the message's content;
- `ForcedToolCall`: `tool_choice` "required" or a named function: the constrained output is
  the call(s) as JSON, returned as `tool_calls` (streamed whole, in the finishing chunk);
- `HermesToolCalls`: `tool_choice` "auto" with the Hermes parser: `<tool_call>` blocks in
  the text are calls, the rest is content (streamed as vLLM streams it).

Each mode makes the finished message (`message`) and, per streamed choice, a `ChoiceStream`
that turns text deltas into chunk deltas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.hermes_tool_parser import (
    HermesStreamParser,
    StreamEvent,
    merged_call_deltas,
    new_call_id,
    parse_hermes,
)


@dataclass(frozen=True)
class StreamPiece:
    """What one update of a streamed choice adds: the chunk's `delta` and finish reason."""

    delta: dict[str, Any]
    finish_reason: str | None


class ChoiceStream:
    """One streamed choice of a plain-text request: each text delta is sent as it comes."""

    def feed(self, text: str, finish_reason: str | None) -> StreamPiece | None:
        """The piece to send for this update; None to hold it back."""
        return StreamPiece({"content": text} if text else {}, finish_reason)


@dataclass(frozen=True)
class PlainText:
    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        return {"role": "assistant", "content": text}, finish_reason

    def stream(self) -> ChoiceStream:
        return ChoiceStream()


PLAIN_TEXT = PlainText()


@dataclass(frozen=True)
class ForcedToolCall:
    """The output is a named function's arguments object (`function_name` set), or an array
    of {"name", "arguments"} ("required"). As in OpenAI's API, a named function finishes
    with "stop", "required" with "tool_calls"; an incomplete call (cut by `max_tokens`)
    stays text."""

    function_name: str | None

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if self.function_name is not None:
            calls = [(self.function_name, value)]
        elif isinstance(value, list) and all(isinstance(c, dict) and "name" in c for c in value):
            calls = [(c["name"], c.get("arguments", {})) for c in value]
        else:
            return None
        return [
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in calls
        ]

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        calls = self.calls(text) if finish_reason == "stop" else None
        if calls is None:
            return {"role": "assistant", "content": text}, finish_reason
        reason = "stop" if self.function_name is not None else "tool_calls"
        return {"role": "assistant", "content": None, "tool_calls": calls}, reason

    def stream(self) -> ChoiceStream:
        return WholeCallStream(self)


@dataclass
class WholeCallStream(ChoiceStream):
    """A forced call is held back until its choice finishes, then sent whole."""

    mode: ForcedToolCall
    text: str = ""

    def feed(self, text: str, finish_reason: str | None) -> StreamPiece | None:
        self.text += text
        if finish_reason is None:
            return None
        message, reason = self.mode.message(self.text, finish_reason)
        delta: dict[str, Any] = {"content": self.text} if message.get("content") else {}
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        return StreamPiece(delta, reason)


@dataclass(frozen=True)
class HermesToolCalls:
    """Calls read from Hermes `<tool_call>` blocks; `text_prefix`: the open call of a
    continued assistant message, which the output completes. "tool_calls" replaces "stop"
    when any call was made."""

    text_prefix: str = ""

    def message(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        content, calls = parse_hermes(self.text_prefix + text)
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        reason = "tool_calls" if finish_reason == "stop" else finish_reason
        message = {"role": "assistant", "content": content}
        return {**message, "tool_calls": [c.openai() for c in calls]}, reason

    def stream(self) -> ChoiceStream:
        return HermesStream(self.text_prefix)


@dataclass
class HermesStream(ChoiceStream):
    """Content and call deltas as the text streams in (vLLM's shape)."""

    text_prefix: str
    parser: HermesStreamParser = field(default_factory=HermesStreamParser)
    started: bool = False

    def feed(self, text: str, finish_reason: str | None) -> StreamPiece | None:
        events: list[StreamEvent] = []
        if not self.started:
            self.started = True
            events += self.parser.feed(self.text_prefix)
        events += self.parser.feed(text)
        if finish_reason is not None:
            events += self.parser.finish()
        delta: dict[str, Any] = {}
        content = "".join(e.content for e in events)
        if content:
            delta["content"] = content
        calls = merged_call_deltas(events)
        if calls:
            delta["tool_calls"] = calls
        reason = finish_reason
        if reason == "stop" and self.parser.called:
            reason = "tool_calls"
        return StreamPiece(delta, reason)


OutputMode = PlainText | ForcedToolCall | HermesToolCalls
