"""tool_choice "auto": refused with the flag to use where the gateway cannot serve it; else the
template gets the tools, a continued open `<tool_call>` is constrained to one call, and the
output's Hermes calls become `tool_calls`, whole and streamed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedserve.services.gateway.auto_tools import AutoTools
from pagedserve.services.gateway.chat_template import load_chat_template, renders_tools
from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.services.gateway.grammar_validator import library_error
from pagedserve.services.gateway.openai_schema import parse_chat_request
from pagedserve.services.gateway.output_modes import HermesToolCalls
from pagedserve.services.gateway.output_processor import ChoiceUpdate
from pagedserve.services.gateway.response_formatter import ResponseFormatter

TEMPLATE = Path(__file__).parents[2] / "fixtures" / "hermes_tool_template.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = {"role": "user", "content": "Weather in Paris?"}


def chat(**fields):
    return parse_chat_request({"messages": [ASK], **fields})


def refusal(auto_tools: AutoTools, request) -> str:
    with pytest.raises(APIError) as info:
        auto_tools.check(request)
    assert info.value.status == 400 and info.value.param == "tool_choice"
    return info.value.message


def test_auto_is_a_400_naming_what_is_missing():
    request = chat(tools=[WEATHER])
    off = refusal(AutoTools(enabled=False, template_renders_tools=True), request)
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in off
    no_template = refusal(AutoTools(enabled=True, template_renders_tools=False), request)
    assert "--chat-template" in no_template and "does not render `tools`" in no_template
    AutoTools(enabled=True, template_renders_tools=True).check(request)
    AutoTools(enabled=False, template_renders_tools=False).check(
        chat(tools=[WEATHER], tool_choice="required")
    )


def test_the_flags_and_the_template_decide():
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        GatewayConfig(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        GatewayConfig(tool_call_parser="mistral")
    template = load_chat_template(str(TEMPLATE))
    assert renders_tools(template) and not renders_tools("{{ messages[0].content }}")
    assert load_chat_template("{{ messages }}") == "{{ messages }}"  # inline, as vLLM
    with pytest.raises(ValueError, match="neither a readable file"):
        load_chat_template("/no/such/template.jinja")
    with pytest.raises(ValueError, match="not valid Jinja"):
        load_chat_template("{% if %}")


def test_a_continued_open_call_is_constrained_to_one_call_object():
    request = chat(
        messages=[ASK, {"role": "assistant", "content": "Sure.\n<tool_call>\n"}],
        tools=[WEATHER], continue_final_message=True, add_generation_prompt=False,
    )  # fmt: skip
    assert request.mode == HermesToolCalls("<tool_call>\n")
    spec = json.loads(request.sampling.structured.output.spec)
    (call,) = spec["anyOf"]
    assert list(call["properties"]) == ["name", "arguments"]  # Hermes' order, not sorted
    assert call["properties"]["name"] == {"enum": ["get_weather"]}
    free = chat(messages=[ASK, {"role": "assistant", "content": "Let me"}], tools=[WEATHER],
                continue_final_message=True, add_generation_prompt=False)  # fmt: skip
    assert free.mode == HermesToolCalls("")  # no open call: the ordinary "auto" constraint
    assert free.sampling.structured.output.kind == "structural_tag"


def accepts(compiled, text: str) -> bool:
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text)


def test_auto_calls_are_free_text_until_a_call_starts_then_follow_the_schema():
    import xgrammar

    structured = chat(tools=[WEATHER]).sampling.structured
    assert library_error(structured.output) is None  # the gateway's check passes
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]))
    compiled = compiler.compile_structural_tag(structured.output.spec)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(compiled, "It is sunny in Paris, no call needed.")
    assert accepts(compiled, f"Let me look.\n{call}\n{call}")
    assert not accepts(compiled, '<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert not accepts(compiled, call.replace('"city"', '"town"'))
    # with another format asked for, or a bound a constraint cannot keep: read leniently
    assert chat(tools=[WEATHER], guided_regex="a+").sampling.structured.param == "guided_regex"
    assert chat(tools=[WEATHER], ignore_eos=True).sampling.structured is None
    assert chat(tools=[WEATHER], min_tokens=3).sampling.structured.param == "tools"


def test_history_tool_calls_reach_the_template_with_object_arguments():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    request = chat(
        messages=[ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        tools=[WEATHER],
    )  # fmt: skip
    assert request.messages[1].tool_fields["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"
    }
    assert request.messages[2].tool_fields == {"tool_call_id": "call_1"}
    with pytest.raises(APIError, match="not valid JSON"):
        bad = {**call, "function": {"name": "f", "arguments": "{nope"}}
        chat(messages=[ASK, {"role": "assistant", "tool_calls": [bad]}])


def test_whole_output_becomes_tool_calls_with_the_continued_prefix():
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    message, reason = HermesToolCalls("<tool_call>\n").message(text, "stop")
    assert reason == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    plain, reason = HermesToolCalls().message("It is sunny.", "stop")
    assert plain == {"role": "assistant", "content": "It is sunny."} and reason == "stop"


def test_stream_chunks_have_vllm_shape():
    formatter = ResponseFormatter("chat", "id", "m", 0, False, mode=HermesToolCalls())
    pieces = ["Checking. ", "<tool_call>\n", '{"name": "get_weather", ', '"arguments": {"city"',
              ': "Paris"}}\n</tool_call>']  # fmt: skip
    chunks = []
    for position, piece in enumerate(pieces):
        last = position == len(pieces) - 1
        update = ChoiceUpdate(piece, [], "stop" if last else None)
        chunk = formatter.chunk(0, update, processor=None)
        if chunk is not None:
            chunks.append(chunk["choices"][0])
    assert chunks[0]["delta"] == {"content": "Checking. "}
    deltas = [d for c in chunks for d in c["delta"].get("tool_calls", [])]
    first = deltas[0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    assert all("name" not in d["function"] and "id" not in d for d in deltas[1:])
    arguments = "".join(d["function"]["arguments"] for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_the_gateway_refuses_to_start_with_a_bad_tool_setup(capsys):
    from pagedserve.services.gateway.__main__ import parse_args

    for argv, reason in (
        (["--enable-auto-tool-choice"], "needs --tool-call-parser"),
        (["--chat-template", "/no/such/template.jinja"], "neither a readable file"),
        (["--tool-call-parser", "mistral"], "invalid choice"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert reason in capsys.readouterr().err
    config = parse_args(["--chat-template", str(TEMPLATE), "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes"])  # fmt: skip
    assert config.enable_auto_tool_choice and config.chat_template == str(TEMPLATE)
