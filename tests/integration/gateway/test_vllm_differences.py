"""The differences a vLLM client saw (issue 34), each asserted as vLLM answers, through the
`openai` client (httpx where the client has no field), against the gateway and the scripted
engine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from pagedserve.services.gateway.chat_template import load_chat_template
from pagedserve.services.gateway.tokenizer import load_tokenizer
from tests.integration.gateway.conftest import API_KEY, MODEL_NAME, start_gateway
from tests.integration.gateway.scripted_engine import DEFAULT_REPLY, SCRIPTED_EOS
from tests.unit.gateway.helpers import TEST_MAX_MODEL_LEN

pytestmark = pytest.mark.integration
ASK = [{"role": "user", "content": "hi"}]
HERMES_TEMPLATE = Path(__file__).parents[2] / "fixtures" / "hermes_tool_template.jinja"


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_stop_reason_is_the_stop_string_or_stop_token_id(client):
    by_string = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=50, stop="va")
    assert by_string.choices[0].model_extra["stop_reason"] == "va"
    by_token = client.completions.create(
        model=MODEL_NAME, prompt="[eos] x", max_tokens=50, extra_body={"stop_token_ids": [2]}
    )
    assert by_token.choices[0].model_extra["stop_reason"] == SCRIPTED_EOS
    by_eos = client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=50)
    assert by_eos.choices[0].model_extra["stop_reason"] is None
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=50, stop="va", stream=True
    ))  # fmt: skip
    assert chunks[-1].choices[0].model_extra["stop_reason"] == "va"


def test_an_output_cut_inside_a_character_holds_its_bytes_back(client, info):
    reply_ids = info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)
    cut = next(
        k
        for k in range(1, len(reply_ids))
        if info.tokenizer.decode(reply_ids[:k]).endswith("\ufffd")
    )
    expected = info.tokenizer.decode(reply_ids[:cut]).rstrip("\ufffd")
    whole = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=cut)
    assert whole.choices[0].text == expected and "\ufffd" not in whole.choices[0].text
    stream = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=cut, stream=True)
    assert "".join(c.choices[0].text for c in stream) == expected


def test_logprobs_include_the_final_eos_token(client, info):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="[eos] x", max_tokens=50, logprobs=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = reply.choices[0]
    assert len(choice.logprobs.tokens) == len(choice.model_extra["token_ids"])
    assert choice.logprobs.token_logprobs[-1] == pytest.approx(-0.25)
    assert reply.usage.completion_tokens == len(choice.logprobs.tokens)


def test_min_tokens_defers_stop_strings(client):
    early = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=50, stop="!")
    assert early.choices[0].text == "Hello"
    deferred = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=50, stop="!", extra_body={"min_tokens": 5}
    )
    assert deferred.choices[0].text == DEFAULT_REPLY  # "!" came within the first 5 tokens


def test_prompt_plus_max_tokens_beyond_the_model_caps_the_output(client, gateway, info):
    prompt = [5] * 250
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=100)
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert gateway.engine.received[-1].sampling.max_tokens == info.max_model_len - 250
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=info.max_model_len + 1)


def test_max_tokens_0_is_refused_without_echo(client):
    with pytest.raises(openai.BadRequestError, match="at least 1") as error:
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=0)
    assert error.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="at least 1"):
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, max_tokens=0)


def test_a_request_chat_template_needs_a_trusting_server(gateway, client, redis_url, info):
    """On /v1/chat/completions and on /tokenize, which renders messages too (it rendered a
    request's template on any server)."""
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    with pytest.raises(openai.BadRequestError, match="trust-request-chat-template"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=ASK, extra_body={"chat_template": template}
        )
    with gateway.client() as c:
        refused = c.post("/tokenize", json={"messages": ASK, "chat_template": template})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "chat_template"
    trusting = start_gateway(redis_url, info, trust_request_chat_template=True)
    try:
        with trusting.client() as c:
            answer = c.post("/v1/chat/completions", json={
                "messages": ASK, "chat_template": template, "max_tokens": 2,
                "return_token_ids": True,
            })  # fmt: skip
            tokenized = c.post("/tokenize", json={"messages": ASK, "chat_template": template})
        assert answer.status_code == 200, answer.text
        assert info.tokenizer.decode(answer.json()["prompt_token_ids"]) == "[hi]"
        assert info.tokenizer.decode(tokenized.json()["tokens"]) == "[hi]"
    finally:
        trusting.stop()


def test_n_above_1_at_temperature_0_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="greedy") as error:
        client.completions.create(model=MODEL_NAME, prompt="x", n=2, temperature=0)
    assert error.value.body["param"] == "n"


def test_tool_choice_required_without_tools_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="needs `tools`") as error:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tool_choice="required")
    assert error.value.body["param"] == "tool_choice"


def test_lm_eval_echo_counts_the_generated_token_and_fills_prompt_logprobs(client, info):
    prompt_ids = info.tokenizer.encode("The cat sat")
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt_ids, echo=True, max_tokens=0, logprobs=1
    )
    (choice,) = reply.choices
    assert choice.text == info.tokenizer.decode(prompt_ids)  # only the prompt is shown
    assert reply.usage.completion_tokens == 1  # the one token vLLM generates
    prompt_logprobs = choice.model_extra["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(prompt_ids)
    assert str(prompt_ids[1]) in prompt_logprobs[1]


def test_small_shapes_match_vllm(client, gateway):
    reply = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2)
    assert "system_fingerprint" in reply.model_extra or reply.system_fingerprint is None
    with gateway.client() as c:
        raw = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()
        assert "system_fingerprint" in raw
        error = c.post("/v1/completions", json={"prompt": "x", "top_p": 7}).json()["error"]
        assert error["code"] == 400 and error["param"] == "top_p"
        card = c.get("/v1/models").json()["data"][0]
        assert card["permission"][0]["object"] == "model_permission"
    # /ping answers as /health does (here 503: the scripted engine posts no status), no key
    health = httpx.get(f"{gateway.base_url}/health", timeout=10)
    for ping in (httpx.get, httpx.post):
        answer = ping(f"{gateway.base_url}/ping", timeout=10)
        assert answer.status_code == health.status_code and answer.json() == health.json()


def test_continuous_usage_stats_has_usage_on_the_first_chunk(client):
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].usage is not None and chunks[0].usage.completion_tokens == 0
    assert all(c.usage is not None for c in chunks)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TWO_CALLS_IN_ONE_BLOCK = (
    '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}]\n</tool_call>'
)


def test_parallel_tool_calls_come_back_as_tool_calls(redis_url):
    # a fresh tokenizer, not the session's cached one: the Hermes template replaces the model's
    info = load_tokenizer("smollm2", TEST_MAX_MODEL_LEN)
    info.tokenizer.chat_template = load_chat_template(str(HERMES_TEMPLATE))
    served = start_gateway(redis_url, info, enable_auto_tool_choice=True, tool_call_parser="hermes")
    served.engine.reply = TWO_CALLS_IN_ONE_BLOCK
    try:
        with openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=API_KEY) as client:
            ask = {"model": MODEL_NAME, "messages": ASK, "tools": [WEATHER], "max_tokens": 200}
            reply = client.chat.completions.create(**ask, parallel_tool_calls=True)
            choice = reply.choices[0]
            cities = [json.loads(c.function.arguments)["city"] for c in choice.message.tool_calls]
            assert cities == ["Paris", "Oslo"] and choice.finish_reason == "tool_calls"
            assert not choice.message.content
            raw = httpx.post(
                f"{served.base_url}/v1/chat/completions",
                json=ask,
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=60,
            )
            assert raw.json()["choices"][0]["message"]["content"] is None  # OpenAI's; vLLM ""
            chunks = list(client.chat.completions.create(**ask, stream=True))
            deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
            assert [d.function.name for d in deltas] == ["get_weather", "get_weather"]
            assert [d.index for d in deltas] == [0, 1]
    finally:
        served.stop()


def test_return_tokens_as_token_ids(client, info):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=3, logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    ids = info.tokenizer.encode(DEFAULT_REPLY, add_special_tokens=False)[:3]
    assert reply.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ids]
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=2, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    assert [e.token for e in chat.choices[0].logprobs.content] == [f"token_id:{t}" for t in ids[:2]]


def test_spaces_between_special_tokens_false(client, gateway):
    gateway.engine.reply = "a<|im_end|><|im_end|>b"
    reply = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=10,
        extra_body={"skip_special_tokens": False, "spaces_between_special_tokens": False},
    )  # fmt: skip
    assert reply.choices[0].text == "a<|im_end|><|im_end|>b"


def test_logprob_tokens_hold_incomplete_characters_back_too(client):
    reply = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=50, logprobs=2)
    tokens = reply.choices[0].logprobs.tokens
    assert not any("\ufffd" in t for t in tokens)
    assert "".join(tokens) == reply.choices[0].text == DEFAULT_REPLY  # "" until a char is whole
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, max_tokens=50, logprobs=True, top_logprobs=2
    )
    entries = chat.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == DEFAULT_REPLY
    assert not any("\ufffd" in t.token for e in entries for t in e.top_logprobs)


def test_where_we_differ_on_purpose(client, gateway):
    """README's "Where we differ on purpose", as the differential check found them."""
    with gateway.client() as c:
        error = c.post("/v1/completions", json={"prompt": "x", "n": 2, "temperature": 0})
        assert error.json()["error"]["type"] == "invalid_request_error"  # vLLM: BadRequestError
        assert error.json()["error"]["param"] == "n"  # vLLM: null
        usage = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()["usage"]
        assert "cached_tokens" in usage["prompt_tokens_details"]  # vLLM: null by default
    reply = client.completions.create(
        model=MODEL_NAME, prompt="x", max_tokens=3, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    logprobs = reply.choices[0].logprobs  # offsets in the text, not in the "token_id:N" strings
    pieces = [logprobs.text_offset[i + 1] - logprobs.text_offset[i] for i in range(2)]
    assert sum(pieces) < len(logprobs.tokens[0]) + len(logprobs.tokens[1])
    assert logprobs.text_offset[-1] < len(reply.choices[0].text)
    # tools with "auto" on a template that does not show the model its tools: a 400 (vLLM: text)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=[WEATHER])
    assert refused.value.body["param"] == "tool_choice"
