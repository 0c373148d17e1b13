"""Request bodies -> one structured-output constraint, from every form the API accepts:

- OpenAI: `response_format` {"type": "text" | "json_object" | "json_schema", "json_schema":
  {"name", "schema", "strict"}}, in chat and completions; `tools` with `tool_choice`
  "required" or a named function (chat only; see `tool_calls`).
- vLLM: `structured_outputs` {"json" | "regex" | "choice" | "grammar" | "json_object"} and the
  older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. A grammar is EBNF/GBNF
  or Lark, told apart by its syntax (`grammar_syntax`).

At most one of them per request. Shape errors are 400s naming the parameter; whether a
schema, regex or grammar compiles is checked by `grammar_validator` before anything is queued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.grammar_syntax import is_lark
from pagedserve.services.gateway.schema_canonical import canonical_schema
from pagedserve.services.gateway.tool_calls import ToolRequest
from pagedserve.shared.protocol import StructuredOutput

STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")
GUIDED_KEYS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
GUIDED_BACKENDS = (None, "", "auto", "xgrammar")
MAX_CHOICES = 256
MAX_SPEC_CHARS = 64 * 1024


@dataclass(frozen=True)
class StructuredRequest:
    """A request's constraint."""

    output: StructuredOutput
    param: str  # the parameter it came from, for error messages


def json_spec(schema: Any, param: str) -> StructuredOutput:
    """A JSON schema (an object, or a string holding one) as a canonical spec: schemas equal
    but for key order (other than their properties' order) give equal specs, so they share
    one compiled grammar."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise bad_request(f"`{param}` is not valid JSON: {exc}", param) from exc
    if not isinstance(schema, dict):
        raise bad_request(f"`{param}` must be a JSON schema object", param)
    return StructuredOutput("json", _bounded(json.dumps(canonical_schema(schema)), param))


def _bounded(text: str, param: str) -> str:
    if len(text) > MAX_SPEC_CHARS:
        raise bad_request(
            f"`{param}` may have at most {MAX_SPEC_CHARS} characters, got {len(text)}", param
        )
    return text


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"`{param}` must be a non-empty string", param)
    return _bounded(value, param)


def choice_spec(choices: Any, param: str) -> StructuredOutput:
    """One of the strings, exactly: a grammar of string literals (JSON escapes are valid
    EBNF escapes)."""
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise bad_request(f"`{param}` must be a non-empty array of non-empty strings", param)
    if len(choices) > MAX_CHOICES:
        raise bad_request(
            f"`{param}` may hold at most {MAX_CHOICES} choices, got {len(choices)}", param
        )
    literals = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
    return StructuredOutput("grammar", _bounded(f"root ::= {literals}", param))


def _from_response_format(value: Any) -> StructuredOutput | None:
    param = "response_format"
    if not isinstance(value, dict):
        raise bad_request("`response_format` must be an object", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object", "")
    if kind != "json_schema":
        raise bad_request(
            f"`response_format.type` must be 'text', 'json_object' or 'json_schema', got {kind!r}",
            "response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise bad_request(
            "`response_format.json_schema` must be an object with a `schema`",
            "response_format.json_schema",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(
            "`response_format.json_schema.strict` must be a boolean",
            "response_format.json_schema.strict",
        )
    return json_spec(spec["schema"], "response_format.json_schema.schema")


def _from_vllm_form(kind: str, value: Any, param: str) -> StructuredOutput:
    if kind == "json":
        return json_spec(value, param)
    if kind == "regex":
        return StructuredOutput("regex", _text(value, param))
    if kind == "choice":
        return choice_spec(value, param)
    if kind == "grammar":
        grammar = _text(value, param)
        return StructuredOutput("lark" if is_lark(grammar) else "grammar", grammar)
    if value is not True:
        raise bad_request(f"`{param}` must be true", param)
    return StructuredOutput("json_object", "")


def _from_structured_outputs(value: Any) -> StructuredOutput:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise bad_request("`structured_outputs` must be an object", param)
    unknown = sorted(k for k, v in value.items() if k not in STRUCTURED_OUTPUTS_KEYS and v)
    if unknown:
        raise bad_request(
            f"`structured_outputs.{unknown[0]}` is not supported; use one of "
            f"{list(STRUCTURED_OUTPUTS_KEYS)}",
            f"{param}.{unknown[0]}",
        )
    given = [k for k in STRUCTURED_OUTPUTS_KEYS if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad_request(
            f"`structured_outputs` must set exactly one of {list(STRUCTURED_OUTPUTS_KEYS)}, "
            f"got {given or 'none'}",
            param,
        )
    return _from_vllm_form(given[0], value[given[0]], f"{param}.{given[0]}")


def _candidates(body: dict[str, Any], tools: ToolRequest | None) -> list[StructuredRequest]:
    found: list[StructuredRequest] = []
    if body.get("response_format") is not None:
        output = _from_response_format(body["response_format"])
        if output is not None:
            found.append(StructuredRequest(output, "response_format"))
    if body.get("structured_outputs") is not None:
        found.append(
            StructuredRequest(
                _from_structured_outputs(body["structured_outputs"]), "structured_outputs"
            )
        )
    for key in GUIDED_KEYS:
        if body.get(key) is not None:
            output = _from_vllm_form(key.removeprefix("guided_"), body[key], key)
            found.append(StructuredRequest(output, key))
    if tools is not None and tools.constraint is not None:
        found.append(StructuredRequest(tools.constraint, "tool_choice"))
    elif (
        tools is not None
        and tools.auto_constraint is not None
        and not (found or body.get("ignore_eos"))
    ):
        # tool_choice "auto" constrains the calls the model may write, unless the request
        # asks for what a constraint cannot honour (then calls are read leniently). With
        # `min_tokens` the worker keeps EOS back until then, as vLLM does.
        found.append(StructuredRequest(tools.auto_constraint, "tools"))
    return found


def read_structured(
    body: dict[str, Any], tools: ToolRequest | None = None
) -> StructuredRequest | None:
    """The request's constraint (`tools`: a chat request's, read by `tool_calls.read_tools`),
    or None; a 400 for a malformed one or for more than one."""
    found = _candidates(body, tools)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"`{f.param}`" for f in found)
        raise bad_request(f"only one structured output constraint per request, got {names}")
    backend = body.get("guided_decoding_backend")
    if backend not in GUIDED_BACKENDS:
        raise bad_request(
            f"`guided_decoding_backend` {backend!r} is not available; this server uses xgrammar",
            "guided_decoding_backend",
        )
    structured = found[0]
    if body.get("ignore_eos"):
        raise bad_request(
            f"`ignore_eos` cannot be combined with `{structured.param}`: a constrained output "
            "ends with the end-of-sequence token when its format is complete",
            "ignore_eos",
        )
    return structured
