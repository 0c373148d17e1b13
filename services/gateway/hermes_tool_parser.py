"""Hermes tool calls in a model's text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks (the format of Qwen2.5, Hermes 2/3 and others), read whole (`parse_hermes`) or as the
text streams in (`HermesStreamParser`), in vLLM's shapes.

- Text outside the blocks is the message's content (streamed as it comes, holding back only
  what may be the start of `<tool_call>`).
- A block is a call when it holds a JSON object with a string `name` and an object
  `arguments` (or none: `{}`); a block that is not (malformed JSON, a missing name) stays in
  the content as written, as vLLM's lenient parser does. The last block may lack its
  `</tool_call>` when the output ends right after its JSON (an EOS instead of the end tag).
- Streamed, a call is announced with its index, id, type and name as soon as the name has
  been read, and its arguments follow as fragments of their JSON text; the fragments of one
  call concatenate to that call's `arguments`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"
# the head of a call object, up to where its arguments' JSON object begins (arguments written
# any other way are sent whole when the block ends)
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\{)')


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object

    def openai(self, call_id: str | None = None) -> dict[str, Any]:
        return {
            "id": call_id or new_call_id(),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def read_calls(block: str) -> list[ToolCall] | None:
    """The calls a block's JSON states: one object, or an array of them (how some models
    write parallel calls in one block); None when it states none."""
    try:
        value = json.loads(block)
    except ValueError:
        return None
    items = value if isinstance(value, list) and value else [value]
    calls = [call for item in items if (call := _call_of(item)) is not None]
    return calls if len(calls) == len(items) else None


def _call_of(value: Any) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output; content None when only calls (and whitespace)."""
    content: list[str] = []
    calls: list[ToolCall] = []
    position = 0
    while (start := text.find(START_TAG, position)) != -1:
        content.append(text[position:start])
        end = text.find(END_TAG, start)
        block_end = len(text) if end == -1 else end + len(END_TAG)
        found = read_calls(text[start + len(START_TAG) : end if end != -1 else len(text)])
        if found is None:
            content.append(text[start:block_end])
        else:
            calls.extend(found)
        position = block_end
    content.append(text[position:])
    joined = "".join(content)
    if calls:
        joined = joined.strip()
    return (joined or None), calls


def _held_tag_prefix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass(slots=True)
class StreamEvent:
    """One piece of a streamed message: content text, or a call's announcement (`name` set,
    with its `call_id`) or arguments fragment, for call number `index`."""

    content: str = ""
    index: int = -1
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""

    def tool_call_delta(self) -> dict[str, Any]:
        delta: dict[str, Any] = {"index": self.index}
        if self.name is not None:
            delta.update(id=self.call_id, type="function")
            delta["function"] = {"name": self.name, "arguments": self.arguments}
        else:
            delta["function"] = {"arguments": self.arguments}
        return delta


@dataclass(slots=True)
class HermesStreamParser:
    """Feed text deltas in order (`feed`), then `finish()`; each returns the events to send."""

    buffer: str = ""  # text not yet turned into events
    in_call: bool = False
    num_calls: int = 0
    head_read: bool = False  # the current call's name went out
    sent_arguments: int = 0  # characters of the current call's arguments sent
    _events: list[StreamEvent] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return self.num_calls > 0

    def feed(self, text: str) -> list[StreamEvent]:
        self.buffer += text
        while self._step():
            pass
        return self._take()

    def finish(self) -> list[StreamEvent]:
        """The output ended: an unterminated block is a call if its JSON is whole."""
        if self.in_call:
            self._end_call(self.buffer, None)
        elif self.buffer:
            self._content(self.buffer)
            self.buffer = ""
        return self._take()

    def _take(self) -> list[StreamEvent]:
        events, self._events = self._events, []
        return events

    def _content(self, text: str) -> None:
        if self.called:  # after a call, whitespace between blocks is not content
            text = text.strip() and text
        if text:
            self._events.append(StreamEvent(content=text))

    def _step(self) -> bool:
        """Consume what can be consumed; True when something changed state."""
        if not self.in_call:
            return self._step_outside()
        end = self.buffer.find(END_TAG)
        if end != -1:
            self._end_call(self.buffer[:end], end + len(END_TAG))
            return True
        self._stream_head_and_arguments()
        return False

    def _step_outside(self) -> bool:
        start = self.buffer.find(START_TAG)
        if start == -1:
            held = _held_tag_prefix(self.buffer, START_TAG)
            ready = self.buffer[: len(self.buffer) - held]
            if self.called and not ready.strip():
                return False  # hold whitespace until something that is not follows
            self._content(ready)
            self.buffer = self.buffer[len(ready) :]
            return False
        self._content(self.buffer[:start])
        self.buffer = self.buffer[start + len(START_TAG) :]
        self.in_call, self.head_read, self.sent_arguments = True, False, 0
        return True

    def _stream_head_and_arguments(self) -> None:
        head = _HEAD.match(self.buffer)
        if head is None:
            return
        if not self.head_read:
            name = json.loads(f'"{head.group(1)}"')
            self._events.append(StreamEvent(index=self.num_calls, call_id=new_call_id(), name=name))
            self.head_read = True
        arguments = self.buffer[head.end() :]
        arguments = arguments[: len(arguments) - _held_tag_prefix(arguments, END_TAG)]
        # the object's own closing brace (and the space around it) may be the last thing
        safe = arguments.rstrip()
        if safe.endswith("}"):
            safe = safe[:-1]
        self._send_arguments(safe)

    def _send_arguments(self, arguments: str) -> None:
        if len(arguments) > self.sent_arguments:
            fragment = arguments[self.sent_arguments :]
            self._events.append(StreamEvent(index=self.num_calls, arguments=fragment))
            self.sent_arguments = len(arguments)

    def _end_call(self, block: str, consumed: int | None) -> None:
        """A block ended (at its end tag, or with the output when `consumed` is None)."""
        calls = None if self.head_read else read_calls(block)
        raw = block if consumed is None else self.buffer[:consumed]
        self.buffer = "" if consumed is None else self.buffer[consumed:]
        self.in_call = False
        if self.head_read:
            self._send_arguments(_arguments_text(block))
            self.num_calls += 1
            return
        if calls is None:  # not a call: it was content all along
            self._content(START_TAG + raw)
            return
        for call in calls:  # whole, but not as the head expects (e.g. an array of calls)
            announce = StreamEvent(index=self.num_calls, call_id=new_call_id(), name=call.name)
            self._events.append(announce)
            self.sent_arguments = 0
            self._send_arguments(call.arguments)
            self.num_calls += 1


def _arguments_text(block: str) -> str:
    """A call block's arguments as written: after the head, without the object's closing
    brace (what the stream sent, plus what it held back)."""
    head = _HEAD.match(block)
    assert head is not None
    arguments = block[head.end() :].rstrip()
    return arguments[:-1] if arguments.endswith("}") else arguments


def merged_call_deltas(events: list[StreamEvent]) -> list[dict[str, Any]]:
    """The call events of one chunk as OpenAI `tool_calls` deltas, one per call (a call's
    announcement and its fragments merged)."""
    deltas: list[dict[str, Any]] = []
    for event in events:
        if event.index < 0:
            continue
        if deltas and deltas[-1]["index"] == event.index and event.name is None:
            deltas[-1]["function"]["arguments"] += event.arguments
        else:
            deltas.append(event.tool_call_delta())
    return deltas
