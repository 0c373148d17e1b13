"""Every API form of a structured-output constraint, its canonical spec, and the 400s."""

from __future__ import annotations

import asyncio
import json

import pytest

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.grammar_validator import GrammarValidator, library_error
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request
from pagedserve.services.gateway.output_modes import ForcedToolCall
from pagedserve.shared.protocol import StructuredOutput

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CANONICAL = json.dumps(SCHEMA, sort_keys=True)
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
A_GRAMMAR = 'root ::= "a"'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**fields):
    return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **fields})


def completion(**fields):
    return parse_completion_request({"prompt": "hi", **fields})


def refused(parse, param: str | None, *fragments: str, **fields) -> None:
    with pytest.raises(APIError) as info:
        parse(**fields)
    assert info.value.status == 400
    assert info.value.param == param
    for fragment in fragments:
        assert fragment in info.value.message, info.value.message


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"response_format": JSON_SCHEMA_FORMAT},
            StructuredOutput("json", CANONICAL),
        ),
        ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object", "")),
        ({"structured_outputs": {"json": SCHEMA}}, StructuredOutput("json", CANONICAL)),
        ({"structured_outputs": {"regex": r"\d+"}}, StructuredOutput("regex", r"\d+")),
        ({"structured_outputs": {"grammar": A_GRAMMAR}}, StructuredOutput("grammar", A_GRAMMAR)),
        ({"guided_json": json.dumps(SCHEMA)}, StructuredOutput("json", CANONICAL)),
        ({"guided_regex": "[ab]"}, StructuredOutput("regex", "[ab]")),
        ({"guided_choice": ["yes", 'say "no"']},
         StructuredOutput("grammar", 'root ::= "yes" | "say \\"no\\""')),
        ({"guided_grammar": 'root ::= "a"'}, StructuredOutput("grammar", 'root ::= "a"')),
    ],
)  # fmt: skip
def test_every_form_gives_one_canonical_spec(fields, expected):
    for parse in (chat, completion):
        structured = parse(**fields).sampling.structured
        assert structured is not None and structured.output == expected


def test_text_format_and_no_fields_mean_unconstrained():
    assert chat(response_format={"type": "text"}).sampling.structured is None
    assert completion().sampling.structured is None


def test_equal_schemas_in_any_key_order_share_a_spec():
    reordered = {"required": ["a"], "properties": {"a": {"type": "integer"}}, "type": "object"}
    a = chat(guided_json=SCHEMA).sampling.structured
    b = chat(structured_outputs={"json": reordered}).sampling.structured
    assert a is not None and b is not None and a.output == b.output


def test_malformed_forms_are_400s_naming_the_parameter():
    refused(chat, "response_format.type", "'json_schema'", response_format={"type": "xml"})
    refused(chat, "response_format.json_schema", "`schema`",
            response_format={"type": "json_schema", "json_schema": {"name": "x"}})  # fmt: skip
    refused(chat, "guided_json", "not valid JSON", guided_json="{nope")
    refused(chat, "guided_choice", "non-empty array", guided_choice=[])
    refused(
        chat, "structured_outputs", "exactly one", structured_outputs={"regex": "a", "grammar": "b"}
    )
    refused(chat, "structured_outputs.structural_tag", "not supported",
            structured_outputs={"structural_tag": "x"})  # fmt: skip
    refused(chat, None, "only one", guided_regex="a", response_format={"type": "json_object"})
    refused(chat, "guided_decoding_backend", "xgrammar", guided_regex="a",
            guided_decoding_backend="outlines")  # fmt: skip


def test_combinations_that_cannot_be_honoured_are_refused():
    refused(chat, "ignore_eos", "end-of-sequence", guided_regex="a", ignore_eos=True)
    # min_tokens holds EOS back until then, also under a constraint (vLLM; the sampler)
    assert chat(guided_regex="a+", min_tokens=2).sampling.min_tokens == 2
    refused(completion, "tools", "chat/completions", tools=[WEATHER], tool_choice="required")


def test_tools_named_required_none_and_auto():
    named = chat(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    structured = named.sampling.structured
    assert structured is not None and named.mode == ForcedToolCall("get_weather")
    assert json.loads(structured.output.spec) == WEATHER["function"]["parameters"]
    required = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(required.sampling.structured.output.spec)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert chat(tools=[WEATHER], tool_choice="none").sampling.structured is None
    auto = chat(tools=[WEATHER])  # "auto": free text; calls constrained once started
    assert auto.auto_tools and auto.tools == [WEATHER]
    assert auto.sampling.structured.output.kind == "structural_tag"
    assert auto.sampling.structured.param == "tools"
    refused(chat, "tool_choice", "not in `tools`", tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}})  # fmt: skip


def test_tool_call_outputs_become_openai_tool_calls():
    out, reason = ForcedToolCall("get_weather").message('{"city": "Paris"}', "stop")
    assert out["content"] is None and reason == "stop"
    assert out["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    out, reason = ForcedToolCall(None).message(text, "stop")
    assert reason == "tool_calls" and json.loads(out["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Oslo"
    }
    truncated, reason = ForcedToolCall("x").message('{"city": "Pa', "length")
    assert truncated["content"] == '{"city": "Pa' and reason == "length"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (StructuredOutput("json", json.dumps({"type": "objekt"})), "invalid at"),
        (StructuredOutput("json", json.dumps({"type": "integer", "minimum": "zero"})), "minimum"),
        (StructuredOutput("regex", "a(b"), "parenthesis"),
        (StructuredOutput("grammar", "root ::= foo"), "foo"),
    ],
)
def test_library_errors_say_what_is_wrong(spec, fragment):
    error = library_error(spec)
    assert error is not None and fragment in error
    assert "/project/" not in error  # the library's source path is cut


def test_validator_answers_a_400_and_caches_by_spec():
    validator = GrammarValidator()
    bad = chat(guided_regex="a(b").sampling.structured
    for _ in range(2):
        with pytest.raises(APIError) as info:
            asyncio.run(validator.check(bad))
        assert info.value.status == 400 and info.value.param == "guided_regex"
    good = chat(guided_json=SCHEMA).sampling.structured
    asyncio.run(validator.check(good))
    assert len(validator._errors) == 2


def test_the_output_writes_properties_in_the_schemas_order():
    import xgrammar

    from pagedserve.services.gpu_worker.json_schema_fixups import fix_json_schema

    schema = {
        "type": "object",
        "required": ["reasoning", "answer"],
        "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
    }
    reordered = {"properties": schema["properties"], "required": ["reasoning", "answer"],
                 "type": "object"}  # fmt: skip
    spec = chat(guided_json=schema).sampling.structured.output
    assert spec == chat(guided_json=reordered).sampling.structured.output  # one grammar
    assert list(json.loads(spec.spec)["properties"]) == ["reasoning", "answer"]
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]))
    compiled = compiler.compile_json_schema(fix_json_schema(spec.spec), any_whitespace=False)
    for text, accepted in (('{"reasoning": "r", "answer": 1}', True),
                           ('{"answer": 1, "reasoning": "r"}', False)):  # fmt: skip
        matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        assert matcher.accept_string(text) is accepted, text
