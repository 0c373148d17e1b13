"""The gateway's OpenAPI 3.0 description, served at /openapi.json.

The request schemas are written from the field table (`field_table.py`) that the validator
reads bodies with, so the document states what the validator enforces; a body outside them
gets a 400 naming the parameter. Fields that need the tokenizer (prompt length against the
model length, token ids against the vocabulary) cannot be stated here and are checked when
the request is built (also 400).
"""

from __future__ import annotations

from typing import Any

from pagedserve.services.gateway.field_table import (
    CHAT_FIELDS,
    COMMON_FIELDS,
    COMPLETION_FIELDS,
    REQUIRED,
)
from pagedserve.services.gateway.request_fields import properties

_COMPLETION_REQUEST = {
    "type": "object",
    "required": REQUIRED["completion"],
    "properties": properties(COMPLETION_FIELDS + COMMON_FIELDS),
}
_CHAT_REQUEST = {
    "type": "object",
    "required": REQUIRED["chat"],
    "properties": properties(CHAT_FIELDS + COMMON_FIELDS),
}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "integer"},
                "reason": {"type": "string", "nullable": True},
            },
        }
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error_responses(*statuses: str) -> dict[str, Any]:
    meaning = {
        "400": "invalid request (the message names the parameter and its bound)",
        "401": "missing or wrong API key",
        "404": "unknown model",
        "413": "body too large",
        "503": "queue full or no engine (retryable: see Retry-After)",
        "500": "engine failure while generating",
    }
    return {s: _json({"$ref": "#/components/schemas/Error"}, meaning[s]) for s in statuses}


def _generate(summary: str, schema_name: str) -> dict[str, Any]:
    ok = {
        "description": "the completion (JSON), or with `stream` server-sent events",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema_name}"}}
                },
            },
            "responses": {
                "200": ok,
                **_error_responses("400", "401", "404", "413", "500", "503"),
            },
        }
    }


def openapi_document(title: str, version: str = "1") -> dict[str, Any]:
    """The OpenAPI description of every route the gateway serves."""
    status_schema = {"type": "object", "properties": {"status": {"type": "string"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/completions": _generate("Text completion (OpenAI-compatible)", "Completion"),
            "/v1/chat/completions": _generate("Chat completion (OpenAI-compatible)", "Chat"),
            "/v1/models": {
                "get": {
                    "summary": "The served model",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": _json({"type": "object"}, "model list"),
                        **_error_responses("401"),
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "200 when some engine is live, else 503 with the reason",
                    "security": [],
                    "responses": {
                        "200": _json(status_schema, "serving"),
                        "503": _json(status_schema, "not serving"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (API key only with --metrics-require-key)",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_error_responses("401"),
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "Completion": _COMPLETION_REQUEST,
                "Chat": _CHAT_REQUEST,
                "Error": _ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
