"""The structured-output cases that the benchmark and the correctness tests share: 20 JSON
schemas covering nested objects, bounded arrays, enums, numeric ranges, required/optional
fields and `additionalProperties: false`, plus regexes and choice lists.

Every string and array is bounded so that a sampled output fits in `MAX_TOKENS_PER_SCHEMA`
tokens: a constrained output that runs out of tokens is truncated, not invalid, and the
correctness sweep wants every output complete."""

from __future__ import annotations

from typing import Any

MAX_TOKENS_PER_SCHEMA = 160


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


_NAME = {"type": "string", "minLength": 1, "maxLength": 12}
_SHORT = {"type": "string", "maxLength": 8}
_AGE = {"type": "integer", "minimum": 0, "maximum": 120}
_SCORE = {"type": "number", "minimum": 0, "maximum": 1}
_COLOR = {"enum": ["red", "green", "blue"]}

JSON_SCHEMAS: list[dict[str, Any]] = [
    _obj({"name": _NAME, "age": _AGE}),
    _obj({"ok": {"type": "boolean"}}),
    _obj({"color": _COLOR, "shade": {"type": "integer", "minimum": 1, "maximum": 9}}),
    _obj({"score": _SCORE, "label": _SHORT}),
    _obj({"tags": {"type": "array", "items": _SHORT, "minItems": 1, "maxItems": 3}}),
    _obj({"point": _obj({"x": _AGE, "y": _AGE})}),
    _obj({"user": _obj({"name": _NAME, "admin": {"type": "boolean"}}), "id": _AGE}),
    _obj({"name": _NAME, "nickname": _SHORT, "age": _AGE}, required=["name"]),
    _obj({"status": {"enum": ["active", "inactive", "banned"]}, "since": _AGE}),
    _obj({"values": {"type": "array", "items": _AGE, "minItems": 2, "maxItems": 4}}),
    _obj({"temperature": {"type": "number", "minimum": -40, "maximum": 50}}),
    _obj(
        {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": _AGE, "maxItems": 2},
                "maxItems": 2,
            }
        }
    ),
    _obj({"level": {"type": "integer", "enum": [1, 2, 3]}, "note": _SHORT}, required=["level"]),
    _obj({"a": _obj({"b": _obj({"c": {"type": "boolean"}})})}),
    _obj({"items": {"type": "array", "maxItems": 2, "items": _obj({"sku": _SHORT, "qty": _AGE})}}),
    _obj({"flag": {"type": "boolean"}, "count": {"type": "integer", "minimum": 10, "maximum": 20}}),
    _obj({"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "confidence": _SCORE}),
    _obj(
        {
            "title": _NAME,
            "pages": {"type": "integer", "minimum": 1, "maximum": 999},
            "genres": {"type": "array", "items": _COLOR, "maxItems": 2},
        },
        required=["title", "pages"],
    ),
    _obj(
        {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
        }
    ),
    _obj(
        {
            "event": _NAME,
            "attendees": {
                "type": "array",
                "items": _obj({"name": _NAME}),
                "minItems": 1,
                "maxItems": 2,
            },
        }
    ),
]

REGEXES: list[str] = [
    r"\d{3}-\d{4}",
    r"(yes|no)",
    r"[A-Z][a-z]{2,6}",
    r"\d{1,2}:\d{2} (AM|PM)",
    r"[a-z]{3,8}@[a-z]{3,6}\.(com|org)",
]

CHOICES: list[list[str]] = [
    ["positive", "negative", "neutral"],
    ["red", "green", "blue", "yellow"],
    ["A", "B"],
]

# The benchmark's "mid-size" schema: a nested object with arrays, enums and ranges.
MID_SIZE_SCHEMA: dict[str, Any] = _obj(
    {
        "id": _AGE,
        "name": _NAME,
        "email": {"type": "string", "maxLength": 24},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": _obj(
            {"street": _NAME, "city": _NAME, "zip": {"type": "string", "pattern": "[0-9]{5}"}}
        ),
        "scores": {"type": "array", "items": _SCORE, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    required=["id", "name", "role", "address"],
)
