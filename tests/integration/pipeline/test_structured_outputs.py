"""Structured outputs through the whole pipeline (gateway, Redis, scheduler, worker processes)
with the official `openai` client, on the default model (SmolLM2-135M) sampled at temperature
1: the outputs parse and validate.

The real model rather than the tiny random one: a random model emits byte tokens that form
invalid UTF-8, which xgrammar lets through inside strings and the detokenizer shows as U+FFFD
(one per byte), so a `maxLength` counted in characters can be exceeded; a trained model does
not write broken UTF-8 (see docs/ARCHITECTURE.md, "Structured outputs")."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import lark
import openai
import pytest
from pydantic import BaseModel, Field

from benchmarks.structured_cases import JSON_SCHEMAS
from tests.integration.pipeline.smollm2_pipeline import WEATHER_TOOL, smollm2_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 120
MESSAGES = [{"role": "user", "content": "Describe a person."}]
# Lark syntax (told apart from EBNF by `start:`): a case-insensitive keyword, nested
# optionals, regex terminals and a common import; bounded so that sampling ends.
SETTINGS_LARK = r"""
start: "set "i pair ["," pair ["," pair]] ";"
pair: KEY "=" value
value: NUMBER_3 | QUOTED | BOOL
KEY: /[a-z]{1,8}/
NUMBER_3: /[0-9]{1,3}/
QUOTED: "\"" /[A-Za-z ]{1,6}/ "\""
BOOL: "true" | "false"
"""


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    likes_tea: bool


@pytest.fixture(scope="module")
def client(redis_server) -> Iterator[openai.OpenAI]:
    with smollm2_client(redis_server.url, "s") as client:
        yield client


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def in_parallel(function, items: list) -> list:
    """Concurrent requests, so that the engine batches them (one at a time is slow on CPU)."""
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(function, items))


def test_json_schema_outputs_validate_for_every_schema(client, model):
    def ask(index: int):
        return client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
            seed=index, response_format=schema_format(JSON_SCHEMAS[index]),
        )  # fmt: skip

    responses = in_parallel(ask, list(range(len(JSON_SCHEMAS))))
    for schema, response in zip(JSON_SCHEMAS, responses, strict=True):
        choice = response.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_parse_with_a_pydantic_model(client, model):
    def parse(seed: int):
        return client.chat.completions.parse(
            model=model, messages=MESSAGES, response_format=Person, max_tokens=MAX_TOKENS,
            temperature=1.0, seed=seed,
        )  # fmt: skip

    for completion in in_parallel(parse, [0, 1, 2]):
        person = completion.choices[0].message.parsed
        assert isinstance(person, Person) and 0 <= person.age <= 120
    beta = client.beta.chat.completions.parse(
        model=model, messages=MESSAGES, response_format=Person, max_tokens=MAX_TOKENS
    )
    assert isinstance(beta.choices[0].message.parsed, Person)


def test_completions_regex_choice_grammar_and_json_object(client, model):
    def complete(**extra):
        response = client.completions.create(
            model=model, prompt="Answer:", max_tokens=40, temperature=1.0, extra_body=extra
        )
        assert response.choices[0].finish_reason == "stop"
        return response.choices[0].text

    seeds = list(range(4))
    for text in in_parallel(lambda s: complete(guided_regex=r"\d{3}-\d{4}", seed=s), seeds):
        assert re.fullmatch(r"\d{3}-\d{4}", text)
    colors = ["red", "green", "blue"]
    for text in in_parallel(lambda s: complete(guided_choice=colors, seed=s), seeds):
        assert text in colors
    grammar = 'root ::= "(" [a-c]+ ")"'
    for text in in_parallel(lambda s: complete(structured_outputs={"grammar": grammar}), seeds):
        assert re.fullmatch(r"\([a-c]+\)", text)
    response = client.completions.create(
        model=model, prompt="{", max_tokens=MAX_TOKENS, temperature=0.0,
        extra_body={"response_format": {"type": "json_object"}},
    )  # fmt: skip
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].text), dict)
    else:  # greedy may loop inside an unbounded object: it stays a prefix of one
        assert response.choices[0].text.startswith("{")


def test_n_choices_and_seeds_are_each_valid_and_reproducible(client, model):
    def run() -> list[str]:
        response = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0, n=3,
            seed=7, response_format=schema_format(JSON_SCHEMAS[0]),
        )  # fmt: skip
        return [c.message.content for c in response.choices]

    first = run()
    for text in first:
        jsonschema.validate(json.loads(text), JSON_SCHEMAS[0])
    assert run() == first


def test_stop_strings_still_cut_a_constrained_output(client, model):
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0, seed=1,
        response_format=schema_format(JSON_SCHEMAS[0]), stop=[","],
    )  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and "," not in choice.message.content
    assert choice.message.content.startswith("{")


def test_named_and_required_tool_calls(client, model):
    named = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0, seed=3,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    schema = WEATHER_TOOL["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    required = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0, seed=4,
        tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False,
    )  # fmt: skip
    assert required.choices[0].finish_reason == "tool_calls"
    calls = required.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)


def test_streamed_tool_call_arrives_whole(client, model):
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0, seed=5,
        tools=[WEATHER_TOOL], tool_choice="required", stream=True, parallel_tool_calls=False,
    )  # fmt: skip
    chunks = [c for c in stream if c.choices]
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(
            json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"]
        )


def test_lark_grammar_outputs_parse_with_lark(client, model):
    parser = lark.Lark(SETTINGS_LARK)

    def complete(seed: int) -> openai.types.CompletionChoice:
        response = client.completions.create(
            model=model, prompt="Settings:", max_tokens=60, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"grammar": SETTINGS_LARK}},
        )  # fmt: skip
        return response.choices[0]

    choices = in_parallel(complete, list(range(6)))
    for choice in choices:
        assert choice.finish_reason == "stop", choice.text
        parser.parse(choice.text)  # raises on any text outside the grammar
    assert len({c.text for c in choices}) > 1  # sampled, not one fixed string
    chat = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=60, temperature=1.0, seed=9,
        extra_body={"guided_grammar": SETTINGS_LARK},
    )  # fmt: skip
    parser.parse(chat.choices[0].message.content)


def test_invalid_specs_are_400s_before_queueing(client, model):
    cases = [
        ({"response_format": schema_format({"type": "objekt"})}, "response_format"),
        ({"extra_body": {"guided_regex": "a(b"}}, "guided_regex"),
        ({"extra_body": {"guided_grammar": "root ::= undefined_rule"}}, "guided_grammar"),
        ({"extra_body": {"guided_grammar": 'start: "a"\nA.2: "b"'}}, "guided_grammar"),
        ({"tools": [WEATHER_TOOL]}, "tool_choice"),  # "auto"
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model, messages=MESSAGES, **kwargs)
        assert info.value.status_code == 400
        assert info.value.body["param"] == param, info.value.body


def test_min_tokens_keeps_a_format_that_may_end_going(client, model):
    """vLLM's rule: EOS stays masked until min_tokens, also under a constraint; a regex that
    may end after one "ab" writes at least min_tokens tokens, and still matches."""
    for seed in range(3):
        reply = client.completions.create(
            model=model, prompt="Letters:", max_tokens=40, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": "(ab)+"}, "min_tokens": 12,
                        "return_token_ids": True},
        )  # fmt: skip
        choice = reply.choices[0]
        assert reply.usage.completion_tokens >= 12
        if choice.finish_reason == "stop":
            assert re.fullmatch("(ab)+", choice.text), choice.text
        else:  # cut by max_tokens, maybe inside a pair
            assert re.fullmatch("(ab)*a?", choice.text), choice.text
