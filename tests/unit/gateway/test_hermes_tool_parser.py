"""The Hermes tool-call parser, whole and streamed: several calls, text before and between,
malformed blocks left as content, and a stream cut at every possible place giving the same
message as the whole text."""

from __future__ import annotations

import itertools
import json

import pytest

from pagedserve.services.gateway.hermes_tool_parser import (
    HermesStreamParser,
    ToolCall,
    parse_hermes,
)

WEATHER = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
TIME = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC+1 {x}"}}</tool_call>'
OUTPUTS = {
    "one call": WEATHER,
    "text then two calls": f"Let me check.\n{WEATHER}\n{TIME}",
    "nested arguments": (
        '<tool_call>{"name": "f", "arguments": {"a": {"b": [1, {"c": "}"}]}}}</tool_call>'
    ),
    "no end tag (EOS)": '<tool_call>\n{"name": "get_time", "arguments": {}}',
    "arguments as a string": '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',
    "arguments first": '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>',
    "malformed then good": f'Hi <tool_call>{{"name": f, "arguments": {{}}}}</tool_call> {TIME}',
    "plain text with < and tags": "a < b and <tool> or </tool_call> stay text",
}


def stream(text: str, cuts: list[int]) -> tuple[str, list[dict], bool]:
    """Feed `text` cut at `cuts`; (content, calls as OpenAI dicts merged by index, called)."""
    parser = HermesStreamParser()
    events = []
    bounds = [0, *cuts, len(text)]
    for start, end in itertools.pairwise(bounds):
        events += parser.feed(text[start:end])
    events += parser.finish()
    content = "".join(e.content for e in events)
    calls: dict[int, dict] = {}
    for event in (e for e in events if e.index >= 0):
        delta = event.tool_call_delta()
        if "id" in delta:
            assert event.index not in calls, "a call is announced once"
            assert delta["function"]["name"], "the name comes in the first delta"
            calls[event.index] = {"name": delta["function"]["name"], "arguments": ""}
        calls[event.index]["arguments"] += delta["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls))), "indexes count up from 0"
    return content, [calls[i] for i in sorted(calls)], parser.called


def as_dicts(calls: list[ToolCall]) -> list[dict]:
    return [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]


def test_whole_outputs():
    content, calls = parse_hermes(OUTPUTS["text then two calls"])
    assert content == "Let me check."
    assert as_dicts(calls) == [
        {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
        {"name": "get_time", "arguments": {"zone": "UTC+1 {x}"}},
    ]
    assert parse_hermes(OUTPUTS["no end tag (EOS)"]) == (None, [ToolCall("get_time", "{}")])
    assert as_dicts(parse_hermes(OUTPUTS["arguments as a string"])[1]) == [
        {"name": "f", "arguments": {"x": 1}}
    ]
    content, calls = parse_hermes(OUTPUTS["malformed then good"])
    assert content == 'Hi <tool_call>{"name": f, "arguments": {}}</tool_call>'
    assert [c.name for c in calls] == ["get_time"]
    text = OUTPUTS["plain text with < and tags"]
    assert parse_hermes(text) == (text, [])
    assert parse_hermes("just text") == ("just text", [])


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_a_stream_cut_anywhere_gives_the_whole_parse(name):
    text = OUTPUTS[name]
    content, calls = parse_hermes(text)
    expected = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]
    cut_sets = [[], list(range(1, len(text)))] + [[i] for i in range(1, len(text))]
    cut_sets += [list(range(step, len(text), step)) for step in (2, 3, 5, 7)]
    for cuts in cut_sets:
        streamed_content, streamed_calls, called = stream(text, cuts)
        assert streamed_content.strip() == (content or ""), cuts
        assert [
            {"name": c["name"], "arguments": json.loads(c["arguments"])} for c in streamed_calls
        ] == expected, cuts
        assert called == bool(calls)


def test_arguments_stream_in_fragments_after_the_name():
    parser = HermesStreamParser()
    events = []
    for piece in ["Sure", "<tool_", 'call>{"name": "get', '_weather", "arguments": {"ci',
                  'ty": "Par', 'is"}}', "</tool_call>"]:  # fmt: skip
        events.append(parser.feed(piece))
    assert [e.content for e in events[0]] == ["Sure"]
    assert events[1] == [] and events[2] == []  # the tag and an unfinished name are held
    announce = events[3][0].tool_call_delta()
    assert announce["function"]["name"] == "get_weather" and announce["id"].startswith("call_")
    fragments = [e.arguments for batch in events[3:] for e in batch]
    assert len([f for f in fragments if f]) >= 3  # arguments arrive as they are written
    assert json.loads("".join(fragments)) == {"city": "Paris"}


def test_text_before_a_tag_is_not_held_longer_than_needed():
    parser = HermesStreamParser()
    assert [e.content for e in parser.feed("The answer <")] == ["The answer "]
    assert [e.content for e in parser.feed("3")] == ["<3"]
    assert [e.content for e in parser.finish()] == []


def test_a_block_that_breaks_after_its_name_streamed_is_still_that_call():
    """Whole, a block with broken arguments is content; streamed, its name has gone out by
    the time the arguments break, so it stays a call with the arguments as written (vLLM's
    streaming parser does the same). Constrained decoding is what prevents it."""
    text = '<tool_call>{"name": "f", "arguments": {"x": </tool_call>'
    assert parse_hermes(text) == (text, [])
    content, calls, called = stream(text, list(range(1, len(text))))
    assert content == "" and called
    assert calls == [{"name": "f", "arguments": '{"x":'}]
