"""One spelling per JSON schema, so that schemas equal but for key order share one compiled
grammar, without changing the order the output writes an object's properties in."""

from __future__ import annotations

from typing import Any


def canonical_schema(schema: Any, is_properties: bool = False) -> Any:
    """The schema with every object's keys sorted, except the order of the properties in a
    `properties` map: the output writes them in that order (as OpenAI's does), and a client may
    rely on it (a "reasoning" field before an "answer")."""
    if isinstance(schema, list):
        return [canonical_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    keys = list(schema) if is_properties else sorted(schema)
    return {
        key: canonical_schema(schema[key], key == "properties" and not is_properties)
        for key in keys
    }
