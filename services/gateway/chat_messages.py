"""A chat request's `messages`: roles, text content (a string or text parts) and the tool
fields a tool-aware template reads; read with errors that name the message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.tool_calls import read_message_tool_fields

MAX_MESSAGES = 1024
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_fields: dict[str, Any] = field(default_factory=dict)  # tool_calls, tool_call_id, name


def _read_content(content: Any, index: int) -> str:
    param = f"messages[{index}].content"
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise bad_request(f"`{param}` parts must be of type 'text'", param)
            if not isinstance(part.get("text"), str):
                raise bad_request(f"`{param}` text parts need a string `text`", param)
            parts.append(part["text"])
        return "\n".join(parts)
    raise bad_request(f"`{param}` must be a string or an array of text parts", param)


def read_messages(body: dict[str, Any]) -> list[ChatMessage]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(
            f"`messages` may hold at most {MAX_MESSAGES} messages, got {len(messages)}",
            "messages",
        )
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"`messages[{index}]` must be an object", f"messages[{index}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad_request(
                f"`messages[{index}].role` must be one of {sorted(CHAT_ROLES)}, got {role!r}",
                f"messages[{index}].role",
            )
        content = _read_content(message.get("content"), index)
        parsed.append(ChatMessage(role, content, read_message_tool_fields(message, index)))
    return parsed


MESSAGES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_MESSAGES,
    "items": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": sorted(CHAT_ROLES)},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "text"],
                            "properties": {
                                "type": {"type": "string", "enum": ["text"]},
                                "text": {"type": "string"},
                            },
                        },
                    },
                ],
                "nullable": True,
            },
        },
    },
}
