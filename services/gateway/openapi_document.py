"""The gateway's OpenAPI 3.0 description, served at /openapi.json.

Bounds come from `openai_schema.py`'s constants, so the document states what the validator
enforces; a body outside them gets a 400 naming the parameter. Fields that need the tokenizer
(prompt length against the model length, token ids against the vocabulary) cannot be stated
here and are checked when the request is built (also 400).
"""

from __future__ import annotations

from typing import Any

from pagedserve.services.gateway.openai_schema import (
    CHAT_ROLES,
    MAX_BATCH_PROMPTS,
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    PRIORITY_LIMIT,
    SEED_MAX,
    SEED_MIN,
)
from pagedserve.shared.request_bounds import INT32_MAX

_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STOP = {
    "oneOf": [
        {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS},
        {
            "type": "array",
            "maxItems": MAX_STOP_STRINGS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS},
        },
    ],
    "nullable": True,
}
_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 0, "maximum": INT32_MAX, "nullable": True},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": INT32_MAX},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 2,
    },
    "seed": {"type": "integer", "minimum": SEED_MIN, "maximum": SEED_MAX, "nullable": True},
    "stop": _STOP,
    "stop_token_ids": {
        "type": "array",
        "maxItems": MAX_STOP_TOKEN_IDS,
        "items": {"type": "integer", "minimum": 0},
    },
    "ignore_eos": {"type": "boolean"},
    "min_tokens": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
    "priority": {"type": "integer", "minimum": -PRIORITY_LIMIT, "maximum": PRIORITY_LIMIT - 1},
    "stream": {"type": "boolean"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean"}},
        "nullable": True,
    },
}
_COMPLETION_REQUEST = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                _TOKEN_IDS,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_BATCH_PROMPTS,
                    "items": {"oneOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]},
                },
            ]
        },
        "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS, "nullable": True},
        **_SAMPLING,
    },
}
_MESSAGE = {
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
}
_CHAT_REQUEST = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": _MESSAGE},
        "max_completion_tokens": {
            "type": "integer",
            "minimum": 0,
            "maximum": INT32_MAX,
            "nullable": True,
        },
        "logprobs": {"type": "boolean"},
        "top_logprobs": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_LOGPROBS,
            "nullable": True,
        },
        "add_generation_prompt": {"type": "boolean"},
        **_SAMPLING,
    },
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
                "code": {"type": "string", "nullable": True},
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
