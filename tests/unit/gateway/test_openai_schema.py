from __future__ import annotations

import pytest

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.field_table import MAX_BATCH_PROMPTS, MAX_N, MAX_STOP_STRINGS
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request


def completion(**fields):
    return parse_completion_request({"model": "m", "prompt": "hi", **fields})


def chat(**fields):
    return parse_chat_request({"messages": [{"role": "user", "content": "hi"}], **fields})


def refused(parse, param: str, *fragments: str, **fields) -> APIError:
    with pytest.raises(APIError) as info:
        parse(**fields)
    error = info.value
    assert error.status == 400
    assert error.param == param
    for fragment in fragments:
        assert fragment in error.message, error.message
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code", "reason"}
    assert body["code"] == 400  # vLLM's integer status; `reason` is our finer word
    assert body["type"] == "invalid_request_error"
    return error


def test_defaults():
    request = completion()
    assert request.prompts == ["hi"]
    s = request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.n, s.logprobs) == (
        16, 1.0, 1.0, -1, 1, None,
    )  # fmt: skip  # 16: OpenAI's and vLLM's default for /v1/completions
    assert chat().sampling.max_tokens is None  # chat: what the context leaves
    assert not request.stream and not request.include_usage


def test_all_fields_accepted():
    s = completion(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=1.5,
        frequency_penalty=-1, repetition_penalty=1.2, seed=3, stop=["a", "b", "a"],
        stop_token_ids=[5], ignore_eos=True, min_tokens=2, logprobs=3, n=2, priority=-4,
        user="ignored", stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    o = s.sampling
    assert o.max_tokens == 7 and o.top_k == 40 and o.min_p == 0.05 and o.seed == 3
    assert o.stop == ("a", "b")  # duplicates dropped
    assert o.stop_token_ids == (5,) and o.ignore_eos and o.min_tokens == 2
    assert o.logprobs == 3 and o.n == 2 and o.priority == -4
    assert s.stream and s.include_usage


@pytest.mark.parametrize(
    ("field", "value", "fragments"),
    [
        ("temperature", -0.1, (">= 0.0", "<= 2.0", "-0.1")),
        ("temperature", 2.5, ("<= 2.0",)),
        ("temperature", "hot", ("finite number", "string")),
        ("temperature", float("nan"), ("finite number",)),
        ("top_p", 0, ("> 0.0", "<= 1.0")),
        ("top_p", 1.01, ("<= 1.0",)),
        ("top_k", -2, (">= -1",)),
        ("top_k", 1.5, ("integer", "number")),
        ("min_p", 1.5, ("<= 1.0",)),
        ("presence_penalty", 2.5, (">= -2.0", "<= 2.0")),
        ("frequency_penalty", -3, (">= -2.0",)),
        ("repetition_penalty", 0, ("> 0.0",)),
        ("max_tokens", -1, (">= 0",)),
        ("max_tokens", True, ("integer", "boolean")),
        ("max_tokens", "5", ("integer", "string")),
        ("n", 0, (">= 1",)),
        ("n", MAX_N + 1, (f"<= {MAX_N}",)),
        ("seed", -(2**63) - 1, (">= -9223372036854775808",)),
        ("seed", 2**63, ("<= 9223372036854775807",)),
        ("logprobs", 21, ("<= 20",)),
        ("logprobs", -1, (">= 0",)),
        ("min_tokens", -1, (">= 0",)),
        ("priority", 2**31, ("<=",)),
        ("ignore_eos", "yes", ("boolean",)),
        ("stream", 1, ("boolean", "integer")),
        ("stop", 5, ("string or an array of strings",)),
        ("stop", ["ok", 3], ("string or an array of strings",)),
        ("stop", [""], ("1 to 256 characters",)),
        ("stop", ["x" * 257], ("1 to 256 characters", "257")),
        ("stop", [str(i) for i in range(MAX_STOP_STRINGS + 1)], (f"at most {MAX_STOP_STRINGS}",)),
        ("stop_token_ids", [-1], ("non-negative integers",)),
        ("stop_token_ids", "1", ("non-negative integers",)),
        ("stop_token_ids", list(range(65)), ("at most 64",)),
        ("suffix", "x", ("not supported",)),
        ("best_of", 3, ("best_of",)),
    ],
)
def test_bad_parameter_names_it_and_the_bound(field, value, fragments):
    refused(completion, field, f"`{field}`", *fragments, **{field: value})


def test_min_tokens_above_max_tokens():
    refused(completion, "min_tokens", "`max_tokens` (3)", "got 4", max_tokens=3, min_tokens=4)


def test_top_k_zero_means_disabled():
    assert completion(top_k=0).sampling.top_k == -1


def test_stream_options_need_stream():
    refused(completion, "stream_options", "only allowed when `stream` is true",
            stream_options={"include_usage": True})  # fmt: skip
    refused(completion, "stream_options", "object", stream=True, stream_options=[1])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", ["text"]),
        ([1, 2, 3], [[1, 2, 3]]),
        (["a", "b"], ["a", "b"]),
        ([[1], [2, 3]], [[1], [2, 3]]),
        (["a", [4]], ["a", [4]]),
    ],
)
def test_prompt_shapes(prompt, expected):
    assert completion(prompt=prompt).prompts == expected


@pytest.mark.parametrize("prompt", [None, 5, [], [[]], "", [1.5], [True], [["a"]], {"a": 1}])
def test_bad_prompts(prompt):
    refused(completion, "prompt", "`prompt`", prompt=prompt)


def test_too_many_prompts():
    refused(completion, "prompt", f"at most {MAX_BATCH_PROMPTS}", prompt=["a"] * 65)


def test_body_must_be_object():
    with pytest.raises(APIError, match="JSON object"):
        parse_completion_request([1, 2])
    with pytest.raises(APIError, match="JSON object"):
        parse_chat_request("hi")


def test_model_must_be_string():
    refused(completion, "model", "`model` must be a string", model=3)


def test_chat_messages():
    request = chat(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ])  # fmt: skip
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "be brief"), ("user", "a\nb"),
    ]  # fmt: skip
    assert request.add_generation_prompt


@pytest.mark.parametrize(
    ("messages", "param", "fragment"),
    [
        ([], "messages", "non-empty array"),
        ("hi", "messages", "non-empty array"),
        ([5], "messages[0]", "object"),
        ([{"role": "robot", "content": "x"}], "messages[0].role", "must be one of"),
        ([{"role": "user", "content": 5}], "messages[0].content", "string or an array"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content", "'text'"),
    ],
)
def test_bad_messages(messages, param, fragment):
    refused(chat, param, fragment, messages=messages)


def test_chat_logprobs():
    assert chat().sampling.logprobs is None
    assert chat(logprobs=True).sampling.logprobs == 0
    assert chat(logprobs=True, top_logprobs=5).sampling.logprobs == 5
    refused(chat, "top_logprobs", "needs `logprobs`", top_logprobs=2)
    refused(chat, "top_logprobs", "<= 20", logprobs=True, top_logprobs=21)
    refused(chat, "logprobs", "boolean", logprobs=3)


def test_chat_max_completion_tokens_wins():
    assert chat(max_completion_tokens=5, max_tokens=9).sampling.max_tokens == 5
    assert chat(max_tokens=9).sampling.max_tokens == 9
    refused(chat, "max_completion_tokens", ">= 0", max_completion_tokens=-1)


def test_chat_refuses_malformed_tools():
    refused(chat, "tools[0]", "'function'", tools=[{"type": "function"}])
