"""Function calling by constrained decoding: `tools` with `tool_choice` "required" or a named
function generate JSON under the functions' parameter schemas, returned as OpenAI `tool_calls`.

- a named function: the output is its arguments object, one call;
- "required": the output is an array of `{"name", "arguments"}` (one item when
  `parallel_tool_calls` is false), each item constrained to one function's schema;
- "none": the tools are ignored;
- "auto" (the default when tools are given): no constraint; the model chooses between text and
  calls in its own format, which the gateway reads (`hermes_tool_parser`) when it was started
  with --enable-auto-tool-choice (`auto_tools.AutoTools` checks that, per request). One case is
  constrained: a continued assistant message that ends with an open `<tool_call>` (the client
  forcing a call) continues as one call object under the tools' schemas (`forced_call_spec`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.hermes_tool_parser import END_TAG, START_TAG, parse_hermes
from pagedserve.services.gateway.schema_canonical import canonical_schema
from pagedserve.shared.protocol import StructuredOutput

MAX_TOOLS = 128
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCallMode:
    """How to read a tool-call output: `function_name` set: the arguments of that function;
    None: an array of {"name", "arguments"}."""

    function_name: str | None


def read_functions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
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


def rendered_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools the chat template is given (as vLLM: all of them, unless tool_choice is
    "none"); the body's `tools` were checked by `read_tool_choice` already."""
    if not body.get("tools") or body.get("tool_choice") == "none":
        return None
    return list(body["tools"])


def read_message_tool_fields(message: dict[str, Any], index: int) -> dict[str, Any]:
    """A message's tool fields, for the template: an assistant's earlier `tool_calls` (their
    `arguments` as JSON objects, as tool-aware templates expect) and a tool result's
    `tool_call_id` / `name`."""
    fields: dict[str, Any] = {}
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            fields[key] = message[key]
    calls = message.get("tool_calls")
    if not calls:
        return fields
    param = f"messages[{index}].tool_calls"
    if message.get("role") != "assistant" or not isinstance(calls, list):
        raise bad_request(f"`{param}` must be an array, on an assistant message", param)
    fields["tool_calls"] = [_history_call(call, f"{param}[{i}]") for i, call in enumerate(calls)]
    return fields


def _history_call(call: Any, param: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request(f"`{param}` must be {{'function': {{'name', 'arguments'}}}}", param)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as exc:
            raise bad_request(f"`{param}.function.arguments` is not valid JSON", param) from exc
    return {**call, "type": "function", "function": {"name": name, "arguments": arguments}}


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


def wants_auto(body: dict[str, Any]) -> bool:
    """Tools given with tool_choice "auto" (or none given, which means "auto")."""
    return bool(body.get("tools")) and body.get("tool_choice") in (None, "auto")


def read_tool_choice(body: dict[str, Any]) -> tuple[StructuredOutput, ToolCallMode | None] | None:
    """The constraint that `tools` + `tool_choice` ask for, or None for "none" and for an
    unforced "auto" (see `hermes_calls_spec`)."""
    functions = read_functions(body)
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    if choice in ("auto", None):
        spec = forced_call_spec(body, functions)
        return None if spec is None else (spec, None)
    if isinstance(choice, dict):
        name = _named_function(choice, functions)
        spec = json.dumps(canonical_schema(functions[name]))
        return StructuredOutput("json", spec), ToolCallMode(name)
    if choice != "required":
        raise bad_request(
            f"`tool_choice` must be 'none', 'auto', 'required' or a function, got {choice!r}",
            "tool_choice",
        )
    return StructuredOutput("json", json.dumps(_calls_schema(body, functions))), ToolCallMode(None)


def _call_objects(functions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One `{"name", "arguments"}` schema per function (the name first, as Hermes writes it:
    these specs are serialized unsorted)."""
    return [
        {
            "type": "object",
            "properties": {"name": {"enum": [name]}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]


def open_call_prefix(body: dict[str, Any]) -> str:
    """With `continue_final_message`, the final assistant message's text from its last
    unclosed `<tool_call>` on ("" if none): the start of a call the output continues."""
    messages = body.get("messages")
    if not body.get("continue_final_message") or not isinstance(messages, list) or not messages:
        return ""
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return ""
    content = last.get("content")
    if not isinstance(content, str):
        return ""
    start = content.rfind(START_TAG)
    if start == -1 or END_TAG in content[start:]:
        return ""
    return content[start:]


def forced_call_spec(
    body: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> StructuredOutput | None:
    """A continued message that ends with an open `<tool_call>` continues as one call object
    under the tools' schemas."""
    if open_call_prefix(body).strip() != START_TAG:
        return None
    return StructuredOutput("json", json.dumps({"anyOf": _call_objects(functions)}))


def hermes_calls_spec(
    body: dict[str, Any], functions: dict[str, dict[str, Any]]
) -> StructuredOutput:
    """tool_choice "auto" for Hermes: free text, but once the model writes `<tool_call>`, the
    call must name a function and its arguments follow that function's schema (an xgrammar
    structural tag, triggered by the start tag). The tags are written as the template shows
    the model: `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`."""
    tags = [
        {
            "type": "tag",
            "begin": f'{START_TAG}\n{{"name": {json.dumps(name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": parameters},
            "end": f"}}\n{END_TAG}",
        }
        for name, parameters in functions.items()
    ]
    tag_format = {
        "type": "triggered_tags",
        "triggers": [START_TAG],
        "tags": tags,
        "stop_after_first": body.get("parallel_tool_calls") is False,
    }
    return StructuredOutput(
        "structural_tag", json.dumps({"type": "structural_tag", "format": tag_format})
    )


def _calls_schema(body: dict[str, Any], functions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    call = _call_objects(functions)
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


def as_auto_tool_message(
    message: dict[str, Any], finish_reason: str | None, prefix: str = ""
) -> tuple[dict[str, Any], str | None]:
    """A chat message whose text holds Hermes calls, with the calls as `tool_calls` (and the
    text outside them as content); "tool_calls" replaces "stop" when any call was made.
    `prefix`: the open call of a continued message, which the text completes."""
    content, calls = parse_hermes(prefix + (message.get("content") or ""))
    if not calls:
        return message, finish_reason
    reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return {**message, "content": content, "tool_calls": [c.openai() for c in calls]}, reason


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
