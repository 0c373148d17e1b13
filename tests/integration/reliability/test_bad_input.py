"""Bad input against a real gateway + engine: a bounded schemathesis run over the gateway's own
/openapi.json (schema-valid and schema-breaking bodies), then hand-written hostile cases.
Every answer must be below 500, a refusal must carry an OpenAI error body with a message, and
afterwards the engine must still serve and hold no block."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from pagedserve.services.gateway.openapi_document import openapi_document
from tests.integration.pipeline.conftest import wait_until_serving
from tests.integration.processes import wait_for
from tests.integration.reliability.cluster import add_engine, add_gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]

API_KEY = "sk-reliability"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_MODEL_LEN = 48  # keeps every schema-valid request short to generate
MAX_EXAMPLES = 30  # per operation (5 operations)
SCHEMA = schemathesis.openapi.from_dict(openapi_document("pagedserve gateway"))


@pytest.fixture(scope="module")
def served(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, "engine-fuzz")
    add_gateway(pipeline, "gw-fuzz", "--api-key", API_KEY, "--max-model-len", str(MAX_MODEL_LEN))
    wait_until_serving_with_key(pipeline)
    return pipeline


def wait_until_serving_with_key(pipeline) -> None:
    wait_until_serving(pipeline)  # /health needs no key


def assert_clear_answer(response: httpx.Response | object, what: str) -> None:
    status = response.status_code  # type: ignore[attr-defined]
    assert status < 500, f"{what}: {status} {response.text[:500]}"  # type: ignore[attr-defined]
    if status >= 400:
        body = response.json()  # type: ignore[attr-defined]
        assert body["error"]["message"], body
        assert isinstance(body["error"]["type"], str)


def test_the_gateway_serves_its_openapi_document(served):
    answer = httpx.get(f"{served.base_url()}/openapi.json", headers=AUTH, timeout=10)
    assert answer.status_code == 200
    document = answer.json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(
        document["paths"]
    )


@SCHEMA.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzing_the_openapi_description_finds_no_server_error(case, served):
    response = case.call(base_url=served.base_url(), headers=AUTH, timeout=60)
    assert_clear_answer(response, f"{case.method} {case.path} {case.body!r:.300}")


def post(pipeline, path: str, **kwargs: object) -> httpx.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{pipeline.base_url()}{path}", headers=headers, timeout=60, **kwargs)


OK = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
HOSTILE_JSON = {
    "huge max_tokens": {**OK, "max_tokens": 10**30},
    "huge temperature": {**OK, "temperature": 1e308},
    "huge seed": {**OK, "seed": 2**64},
    "huge n": {**OK, "n": 10**9},
    "negative max_tokens": {**OK, "max_tokens": -1},
    "negative n": {**OK, "n": -3},
    "negative top_p": {**OK, "top_p": -0.5},
    "negative logprobs": {**OK, "logprobs": -1},
    "max_tokens beyond the model": {**OK, "max_tokens": MAX_MODEL_LEN + 1},  # == caps (vLLM)
    "wrong type prompt": {**OK, "prompt": 123},
    "wrong type temperature": {**OK, "temperature": "hot"},
    "wrong type stream": {**OK, "stream": "yes"},
    "wrong type stop": {**OK, "stop": {"a": 1}},
    "bool as int": {**OK, "max_tokens": True},
    "empty prompt": {**OK, "prompt": ""},
    "empty prompt list": {**OK, "prompt": []},
    "empty token list in a batch": {**OK, "prompt": [[]]},
    "thousands of stop strings": {**OK, "stop": [f"s{i}" for i in range(5000)]},
    "a huge stop string": {**OK, "stop": ["x" * 100_000]},
    "token id beyond the vocabulary": {**OK, "prompt": [1, 2, 10**6]},
    "negative token id": {**OK, "prompt": [1, -1]},
    "huge token id": {**OK, "prompt": [2**70]},
    "stop token id beyond the vocabulary": {**OK, "stop_token_ids": [10**9]},
    "NUL bytes in the prompt": {**OK, "prompt": "a\u0000b"},
    "unknown model": {**OK, "model": "gpt-17"},
    "unsupported field": {**OK, "prompt_embeds": "abc"},
    "stream_options without stream": {**OK, "stream_options": {"include_usage": True}},
    "too many prompts": {**OK, "prompt": ["a"] * 1000},
}
HOSTILE_RAW = {
    "non-UTF-8 body": b'{"prompt": "\xff\xfe"}',
    "not JSON": b"{",
    "JSON array body": b"[1, 2]",
    "JSON string body": b'"hello"',
    "NaN": b'{"prompt": "x", "temperature": NaN}',
    "Infinity": b'{"prompt": "x", "max_tokens": Infinity}',
    "deeply nested": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "empty body": b"",
    "lone surrogate in the prompt": b'{"prompt": "\\ud800 hi", "max_tokens": 4}',
    "lone surrogate in a stop string": b'{"prompt": "hi", "max_tokens": 4, "stop": ["\\udfff"]}',
    "10 MB body": b'{"prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}',
}
# Harmless oddities that may be served or refused; either way not a 5xx.
MAY_SUCCEED = {
    "stop token id beyond the vocabulary",
    "NUL bytes in the prompt",
}
HOSTILE_CHAT = {
    "messages not a list": {"messages": "hi"},
    "empty messages": {"messages": []},
    "unknown role": {"messages": [{"role": "wizard", "content": "hi"}]},
    "role an array": {"messages": [{"role": ["user"], "content": "hi"}]},  # was a 500
    "a tool that is not an object": {  # was a 500
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [None],
    },
    "content of wrong type": {"messages": [{"role": "user", "content": 5}]},
    "image part": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    "top_logprobs without logprobs": {
        "messages": [{"role": "user", "content": "hi"}],
        "top_logprobs": 3,
    },
    "thousands of messages": {"messages": [{"role": "user", "content": "a"}] * 5000},
}


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_hostile_completion_fields_get_a_clear_4xx(served, name):
    answer = post(served, "/v1/completions", json=HOSTILE_JSON[name])
    assert_clear_answer(answer, name)
    if name not in MAY_SUCCEED:
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text[:300])


@pytest.mark.parametrize("name", sorted(HOSTILE_RAW))
def test_hostile_raw_bodies_get_a_clear_4xx(served, name):
    answer = post(served, "/v1/completions", content=HOSTILE_RAW[name],
                  headers={"Content-Type": "application/json"})  # fmt: skip
    assert_clear_answer(answer, name)
    if name not in MAY_SUCCEED:
        assert answer.status_code == (413 if name == "10 MB body" else 400), answer.text[:300]


@pytest.mark.parametrize("name", sorted(HOSTILE_CHAT))
def test_hostile_chat_bodies_get_a_clear_4xx(served, name):
    answer = post(served, "/v1/chat/completions", json=HOSTILE_CHAT[name])
    assert_clear_answer(answer, name)
    assert answer.status_code == 400, answer.text[:300]


def test_the_engine_is_not_stuck_afterwards(served):
    answer = post(served, "/v1/completions", json={**OK, "max_tokens": 8, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8

    def idle() -> bool:
        status = served.engine_status("engine-fuzz")
        return status.num_running == status.num_waiting == 0 and (
            status.num_free_blocks == status.num_total_blocks > 0
        )

    wait_for("engine idle with every block free", idle, 60)
    assert served.engine_status("engine-fuzz").integrity_ok
    assert all(p.is_alive() for p in served.processes())
    assert json.loads(httpx.get(f"{served.base_url()}/health", timeout=5).text)["status"] == "ok"
