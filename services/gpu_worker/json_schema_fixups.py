"""Rewrites of JSON schemas that work around xgrammar's gaps before it compiles them.

xgrammar 0.2 builds a length-bounded string (`minLength` / `maxLength`) from a character class
that lets raw control characters (U+0000-U+001F) through, which JSON forbids inside strings:
a sampled output could then fail to parse (`json.loads` refuses it). Such a string becomes an
equivalent `pattern` that excludes them, which xgrammar compiles as a JSON-string regex. (Its
unbounded strings already exclude them.)"""

from __future__ import annotations

import json
from typing import Any

# Keys whose values are data, not subschemas: never rewritten.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})
_STRING_SHAPE_KEYS = ("pattern", "format", "enum", "const")


def _bounded_string_pattern(schema: dict[str, Any]) -> dict[str, Any]:
    low = int(schema.get("minLength", 0))
    high = schema.get("maxLength")
    count = f"{{{low},{'' if high is None else int(high)}}}"
    rest = {k: v for k, v in schema.items() if k not in ("minLength", "maxLength")}
    return {**rest, "pattern": f'^[^\\x00-\\x1f"\\\\]{count}$'}


def _rewrite(node: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: (v if k in _DATA_KEYS else _rewrite(v)) for k, v in node.items()}
    is_bounded_string = node.get("type") == "string" and (
        "minLength" in node or "maxLength" in node
    )
    if is_bounded_string and not any(k in node for k in _STRING_SHAPE_KEYS):
        return _bounded_string_pattern(node)
    return node


def fix_json_schema(schema_text: str) -> str:
    """The schema (JSON text) with xgrammar's known gaps worked around. Key order is kept:
    xgrammar generates an object's properties in the schema's order (a forced Hermes call
    must write its "name" before its "arguments")."""
    return json.dumps(_rewrite(json.loads(schema_text)))


def fix_structural_tag(tag_text: str) -> str:
    """A structural tag (JSON text) with each JSON schema it holds fixed as above."""
    return json.dumps(_fix_tag_schemas(json.loads(tag_text)))


def _fix_tag_schemas(node: Any) -> Any:
    if isinstance(node, list):
        return [_fix_tag_schemas(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
        return {**node, "json_schema": json.loads(fix_json_schema(json.dumps(node["json_schema"])))}
    return {key: _fix_tag_schemas(value) for key, value in node.items()}
