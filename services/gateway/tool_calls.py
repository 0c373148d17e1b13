"""Function calling by constrained decoding: `tools` with `tool_choice` "required" or a named
function generate JSON under the functions' parameter schemas, returned as OpenAI `tool_calls`.

- a named function: the output is its arguments object, one call;
- "required": the output is an array of `{"name", "arguments"}` (one item when
  `parallel_tool_calls` is false), each item constrained to one function's schema;
- "none": the tools are ignored; "auto" would need the model to choose between text and a
  call in its own format (e.g. Hermes' `<tool_call>...</tool_call>`), which the default model's
  chat template does not define: a 400 that says so.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.gateway.errors import bad_request
from shared.protocol import StructuredOutput

MAX_TOOLS = 128
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCallMode:
    """How to read a tool-call output: `function_name` set: the arguments of that function;
    None: an array of {"name", "arguments"}."""

    function_name: str | None


def _read_tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Function name -> parameters schema."""
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"`tools` must be an array of at most {MAX_TOOLS} tools", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise bad_request(
                f"`{param}` must be {{'type': 'function', 'function': {{...}}}}", param
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"`{param}.function.name` must be a non-empty string", param)
        parameters = function.get("parameters") or EMPTY_PARAMETERS
        if not isinstance(parameters, dict):
            raise bad_request(f"`{param}.function.parameters` must be a JSON schema object", param)
        functions[name] = parameters
    return functions


def _named_function(choice: dict[str, Any], functions: dict[str, dict[str, Any]]) -> str:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            "`tool_choice` must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if name not in functions:
        raise bad_request(
            f"`tool_choice` names the function {name!r}, which is not in `tools` "
            f"({sorted(functions)})",
            "tool_choice",
        )
    return name


def read_tool_choice(body: dict[str, Any]) -> tuple[StructuredOutput, ToolCallMode] | None:
    """The constraint that `tools` + `tool_choice` ask for, or None for "none"."""
    functions = _read_tools(body)
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    if choice == "auto":
        raise bad_request(
            "`tool_choice` 'auto' is not supported for this model: its chat template defines "
            "no tool-call format (such as Hermes' <tool_call>) for the model to choose a call "
            "in; use 'required' or name a function",
            "tool_choice",
        )
    if isinstance(choice, dict):
        name = _named_function(choice, functions)
        spec = json.dumps(functions[name], sort_keys=True)
        return StructuredOutput("json", spec), ToolCallMode(name)
    if choice != "required":
        raise bad_request(
            f"`tool_choice` must be 'none', 'auto', 'required' or a function, got {choice!r}",
            "tool_choice",
        )
    return StructuredOutput("json", json.dumps(_calls_schema(body, functions))), ToolCallMode(None)


def _calls_schema(body: dict[str, Any], functions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    call = [
        {
            "type": "object",
            "properties": {"name": {"enum": [name]}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": call}, "minItems": 1}
    if body.get("parallel_tool_calls") is False:
        schema["maxItems"] = 1
    return schema


def tool_calls_from_text(text: str, mode: ToolCallMode) -> list[dict[str, Any]] | None:
    """OpenAI `tool_calls` from a finished constrained output; None when it is not a
    complete call (a truncated output stays text)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if mode.function_name is not None:
        calls = [(mode.function_name, value)]
    elif isinstance(value, list) and all(isinstance(c, dict) and "name" in c for c in value):
        calls = [(c["name"], c.get("arguments", {})) for c in value]
    else:
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        for name, arguments in calls
    ]


def as_tool_call_message(
    message: dict[str, Any], finish_reason: str | None, mode: ToolCallMode
) -> tuple[dict[str, Any], str | None]:
    """A chat message (and its finish reason) with the output turned into tool calls. As in
    OpenAI's API, a forced (named) function finishes with "stop", "required" with
    "tool_calls"."""
    calls = tool_calls_from_text(message.get("content") or "", mode)
    if calls is None or finish_reason != "stop":
        return message, finish_reason
    reason = "stop" if mode.function_name is not None else "tool_calls"
    return {**message, "content": None, "tool_calls": calls}, reason
