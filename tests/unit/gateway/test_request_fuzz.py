"""Any JSON body, through everything the gateway does with a request before it reaches Redis:
parsing, admission, tokenizing (the chat template included), the length checks, the grammar
check and the engine requests on the wire. Each step either goes through or raises a 4xx
`APIError`; any other exception would be a 500 for the client. The bodies mix well-typed
values of the fields the API reads (so that most get past parsing and reach the later steps)
with arbitrary JSON in any of them. The schema-driven fuzzing through a real gateway
(`tests/integration/reliability/test_bad_input.py`) sends only what the OpenAPI document
describes, or breaks it in the ways schemathesis knows; this reaches the readers' own corners.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pagedserve.services.gateway.admission import admit_chat, admit_completion
from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.grammar_validator import GrammarValidator
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request
from pagedserve.services.gateway.request_builder import (
    check_lengths,
    engine_requests,
    tokenize_chat,
    tokenize_completion,
)
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.shared.protocol import decode, encode

EXAMPLES = 300
MAX_SEQS = 64

LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 60),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["", "auto", "none", "required", "function", "text", "user", "<|im_end|>"]),
)
KEYS = st.sampled_from(["type", "name", "function", "schema", "properties", "role", "content"])
ANY_JSON = st.recursive(
    LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(KEYS | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)

SCHEMA = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["object", "string", "integer", "number", "boolean", "array"]),
            "enum": st.lists(LEAF, min_size=1, max_size=3),
            "pattern": st.sampled_from(["a+", "[", "\\d{2,3}"]),
            "minimum": LEAF,
            "maxLength": LEAF,
            "required": ANY_JSON,
        },
    ),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={
            "properties": st.dictionaries(st.text(max_size=4), inner, max_size=3),
            "items": inner,
            "anyOf": st.lists(inner, max_size=2),
            "$ref": st.just("#/$defs/a"),
        },
    ),
    max_leaves=6,
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g"])}, optional={"parameters": SCHEMA}
        ),
    }
)
# Each field's well-typed values; any field also gets arbitrary JSON now and then.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["m", "x"]),
    "max_tokens": st.integers(0, 300),
    "max_completion_tokens": st.integers(0, 300),
    "min_tokens": st.integers(0, 6),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.1, 2),
    "length_penalty": st.floats(-2, 2),
    "seed": st.integers(-(2**63), 2**64),
    "n": st.integers(1, 4),
    "best_of": st.integers(1, 4),
    "use_beam_search": st.booleans(),
    "priority": st.integers(-5, 5),
    "logprobs": st.one_of(st.integers(0, 5), st.booleans()),
    "top_logprobs": st.integers(0, 5),
    "prompt_logprobs": st.integers(0, 3),
    "echo": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "return_token_ids": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(),
    "add_special_tokens": st.booleans(),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(),
    "truncate_prompt_tokens": st.integers(-1, 300),
    "stop": st.lists(st.text(max_size=4), max_size=4) | st.text(max_size=4),
    "stop_token_ids": st.lists(st.integers(0, 49151), max_size=3),
    "bad_words": st.lists(st.text(max_size=6), max_size=3),
    "allowed_token_ids": st.lists(st.integers(-1, 50000), max_size=4),
    "logit_bias": st.dictionaries(
        st.sampled_from(["1", "49151", "49152", "-1", "x"]), st.floats(-100, 100), max_size=3
    ),
    "cache_salt": st.text(max_size=5),
    "response_format": st.one_of(
        st.just({"type": "json_object"}),
        st.builds(
            lambda s: {"type": "json_schema", "json_schema": {"name": "s", "schema": s}}, SCHEMA
        ),
    ),
    "guided_json": SCHEMA,
    "guided_regex": st.sampled_from(["a+", "(a|b)*c", "\\d{1,3}", "["]),
    "guided_choice": st.lists(st.text(max_size=4), min_size=1, max_size=3),
    "guided_grammar": st.sampled_from(['root ::= "a" | "b"', "root ::="]),
    "tools": st.lists(TOOL, min_size=1, max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required"])
    | st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.just("f")})}
    ),
    "chat_template_kwargs": st.dictionaries(st.text(max_size=5), ANY_JSON, max_size=2),
}


@st.composite
def fields(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=6, unique=True))
    return {name: draw(st.one_of(*[FIELDS[name]] * 6, ANY_JSON)) for name in names}


PROMPT = st.one_of(
    st.text(max_size=30),
    st.lists(st.integers(0, 49151), min_size=1, max_size=8),
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3),
    ANY_JSON,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant"]),
        "content": st.text(max_size=20)
        | st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
            max_size=2,
        ),
    },
)
ANY_MESSAGE = st.fixed_dictionaries(
    {"role": ANY_JSON},
    optional={"content": ANY_JSON, "name": ANY_JSON, "tool_calls": ANY_JSON},
)
MESSAGES = st.lists(st.one_of(MESSAGE, MESSAGE, ANY_MESSAGE), min_size=1, max_size=3) | ANY_JSON


def through_the_gateway(kind: str, body: Any, info: TokenizerInfo) -> None:
    """What the gateway does with `body` before enqueueing it; a 4xx `APIError` is an answer."""
    try:
        if kind == "completion":
            parsed: Any = parse_completion_request(body)
            admit_completion(parsed, info, MAX_SEQS)
            prompts = tokenize_completion(parsed, info)
            check_lengths(prompts, parsed.sampling, info.max_model_len, "max_tokens")
        else:
            parsed = parse_chat_request(body)
            admit_chat(parsed, MAX_SEQS)
            prompts = tokenize_chat(parsed, info)
            max_len, name = info.max_model_len, parsed.max_tokens_param
            check_lengths(prompts, parsed.sampling, max_len, name, "messages")
        asyncio.run(GrammarValidator().check(parsed.sampling.structured))
        for request in engine_requests("cmpl-fuzz", prompts, parsed.sampling, info, "gw"):
            assert decode(encode(request)) == request
    except APIError as error:
        assert 400 <= error.status < 500, (error.status, error.message)
        assert error.message


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(prompt=PROMPT, extra=fields())
@example(prompt="hi", extra={"tools": [None]})  # tools go to chat only: a 400 here
def test_any_completion_body_is_served_or_refused_with_a_4xx(info, prompt, extra):
    through_the_gateway("completion", {"prompt": prompt, **extra}, info)


@SETTINGS
@given(messages=MESSAGES, extra=fields())
@example(messages=[{"role": []}], extra={})  # an unhashable role: was a TypeError (a 500)
@example(messages=[{"role": "user", "content": "hi"}], extra={"tools": [None]})  # was an
# AttributeError: a tool that is not an object
def test_any_chat_body_is_served_or_refused_with_a_4xx(info, messages, extra):
    through_the_gateway("chat", {"messages": messages, **extra}, info)
