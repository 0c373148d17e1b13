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

A body's tools are read once (`read_tools`), into the output mode (`output_modes`) that the
formatter renders with and the constraint the engine decodes under.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.hermes_tool_parser import END_TAG, START_TAG
from pagedserve.services.gateway.output_modes import (
    PLAIN_TEXT,
    ForcedToolCall,
    HermesToolCalls,
    OutputMode,
)
from pagedserve.services.gateway.schema_canonical import canonical_schema
from pagedserve.shared.protocol import StructuredOutput

MAX_TOOLS = 128
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def read_functions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Function name -> parameters schema."""
    tools = body.get("tools")
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"`tools` must be an array of at most {MAX_TOOLS} tools", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
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


@dataclass(frozen=True)
class ToolRequest:
    """What a chat body's `tools` and `tool_choice` ask for, read once."""

    rendered: list[dict[str, Any]] | None  # shown to the model by the template (vLLM: all)
    mode: OutputMode  # how the output is returned
    constraint: StructuredOutput | None  # a forced call's (or a forced open call's)
    auto_constraint: StructuredOutput | None  # "auto": applies when nothing else constrains

    @property
    def auto(self) -> bool:
        return isinstance(self.mode, HermesToolCalls)


def read_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools, or None when it gives none; a 400 for a malformed one and for a
    `tool_choice` that needs tools without any (as vLLM)."""
    choice = body.get("tool_choice")
    if not body.get("tools"):
        if choice == "required" or isinstance(choice, dict):
            raise bad_request("`tool_choice` 'required' or a named function needs `tools`",
                              "tool_choice")  # fmt: skip
        return None
    functions = read_functions(body)
    if choice == "none":
        return ToolRequest(None, PLAIN_TEXT, None, None)
    rendered = list(body["tools"])
    if choice in ("auto", None):
        prefix = open_call_prefix(body)
        auto = hermes_calls_spec(body, functions)
        return ToolRequest(rendered, HermesToolCalls(prefix), forced_call_spec(prefix, functions),
                           auto)  # fmt: skip
    if isinstance(choice, dict):
        name = _named_function(choice, functions)
        spec = StructuredOutput("json", json.dumps(canonical_schema(functions[name])))
        return ToolRequest(rendered, ForcedToolCall(name), spec, None)
    if choice != "required":
        raise bad_request(
            f"`tool_choice` must be 'none', 'auto', 'required' or a function, got {choice!r}",
            "tool_choice",
        )
    spec = StructuredOutput("json", json.dumps(_calls_schema(body, functions)))
    return ToolRequest(rendered, ForcedToolCall(None), spec, None)


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


def forced_call_spec(prefix: str, functions: dict[str, dict[str, Any]]) -> StructuredOutput | None:
    """A continued message that ends with an open `<tool_call>` (`prefix`) continues as one
    call object under the tools' schemas."""
    if prefix.strip() != START_TAG:
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
