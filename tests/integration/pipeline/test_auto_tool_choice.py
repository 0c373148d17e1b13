"""tool_choice "auto" with the Hermes format through the whole pipeline and the official
`openai` client: a gateway started with a Hermes chat template, --enable-auto-tool-choice and
--tool-call-parser hermes, on the default model (SmolLM2-135M) sampled at temperature 1.

A 135M model does not decide to call a tool reliably by itself, so the tests make it call one
the way a client can: the assistant turn is continued (`continue_final_message`) from an open
`<tool_call>`, which the gateway constrains to one call object under the tools' schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.integration.pipeline.smollm2_pipeline import WEATHER_TOOL, smollm2_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEMPLATE = Path(__file__).parents[2] / "fixtures" / "hermes_tool_template.jinja"
TOOLS = [
    WEATHER_TOOL,
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 8}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
FORCED = {
    "messages": [ASK, {"role": "assistant", "content": "<tool_call>\n"}],
    "tools": TOOLS,
    "max_tokens": 80,
    "temperature": 1.0,
    "extra_body": {"continue_final_message": True, "add_generation_prompt": False},
}


@pytest.fixture(scope="module")
def client(redis_server) -> Iterator[openai.OpenAI]:
    hermes = ("--chat-template", str(TEMPLATE), "--enable-auto-tool-choice",
              "--tool-call-parser", "hermes", "--max-model-len", "1024")  # fmt: skip
    with smollm2_client(redis_server.url, "t", *hermes) as client:  # the tools' prompt: ~300
        yield client


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def assert_valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_a_forced_call_parses_and_validates(client, model):
    def ask(seed: int):
        return client.chat.completions.create(model=model, seed=seed, **FORCED).choices[0]

    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(ask, range(4)))
    for choice in choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert_valid(call.function.name, call.function.arguments)
        assert not choice.message.content


def test_a_streamed_call_comes_as_name_then_argument_fragments(client, model):
    stream = client.chat.completions.create(model=model, seed=11, stream=True, **FORCED)
    chunks = [c.choices[0] for c in stream if c.choices]
    deltas = [d for c in chunks for d in (c.delta.tool_calls or [])]
    assert deltas, [c.delta for c in chunks]
    first = deltas[0]
    assert first.index == 0 and first.id.startswith("call_") and first.function.name
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert len(deltas) > 2  # the arguments arrived in pieces as they were generated
    arguments = (first.function.arguments or "") + "".join(
        d.function.arguments or "" for d in deltas[1:]
    )
    assert_valid(first.function.name, arguments)
    assert chunks[-1].finish_reason == "tool_calls"
    assert not any(c.delta.content for c in chunks)


def test_tools_reach_the_template_and_free_answers_stay_text(client, model):
    plain = client.chat.completions.create(
        model=model, messages=[ASK], max_tokens=24, temperature=0.0
    )
    auto = client.chat.completions.create(
        model=model, messages=[ASK], tools=TOOLS, max_tokens=24, temperature=0.0
    )
    # the tool list is in the prompt: the template rendered `tools`
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    choice = auto.choices[0]
    if choice.message.tool_calls:  # the model chose to call: each call is well formed
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            json.loads(call.function.arguments)
    else:
        assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_a_conversation_with_tool_results_continues(client, model):
    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}
    messages = [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, result]
    response = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=16, temperature=0.0
    )
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")
    shorter = client.chat.completions.create(
        model=model, messages=[ASK], tools=TOOLS, max_tokens=1, temperature=0.0
    )
    # the earlier call and its result are in the prompt
    assert response.usage.prompt_tokens > shorter.usage.prompt_tokens + 20
