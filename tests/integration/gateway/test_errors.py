"""Unhappy paths: every bad input gets its documented status and an OpenAI-shaped body, and
the gateway keeps serving afterwards; engine errors map to statuses; auth; request ids."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
import redis

from pagedserve.services.gateway.gateway_config import MAX_BODY_BYTES
from tests.integration.conftest import free_port
from tests.integration.gateway.conftest import MODEL_NAME, start_gateway
from tests.integration.gateway.scripted_engine import DEFAULT_REPLY, ScriptedEngine

pytestmark = pytest.mark.integration


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code", "reason"}
    assert body["error"]["message"]
    return body["error"]


def still_serving(c: httpx.Client) -> None:
    r = c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "ok", "max_tokens": 60})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == DEFAULT_REPLY, r.text


BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid UTF-8"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, "`temperature`"),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, "> 0.0 and <= 1.0"),
    (json.dumps({"prompt": "x", "max_tokens": 10**6}).encode(), 400, "maximum context length"),
    (json.dumps({"prompt": "x", "model": "gpt-4"}).encode(), 404, "does not exist"),
    (json.dumps({"prompt": [1, 10**9]}).encode(), 400, "outside [0, 49152)"),
    (json.dumps({"prompt": "x", "n": 1000}).encode(), 400, "<= 16"),
    (json.dumps({"prompt": "x", "stop": ["a"] * 17}).encode(), 400, "at most 16"),
]


def test_bad_inputs_then_still_serving(gateway):
    with gateway.client() as c:
        for body, status, fragment in BAD_BODIES:
            r = c.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            )
            assert fragment in error_of(r, status)["message"], (body, r.text)
        r = c.post("/v1/chat/completions", json={"messages": []})
        assert error_of(r, 400)["param"] == "messages"
        assert error_of(c.get("/v1/nope"), 404)["reason"] == "not_found"
        assert error_of(c.get("/v1/completions"), 405)
        still_serving(c)


def test_too_long_prompt_says_both_numbers(gateway, info):
    with gateway.client() as c:
        r = c.post("/v1/completions", json={"prompt": [5] * 200, "max_tokens": 300})
    error = error_of(r, 400)
    assert error["message"].startswith(  # vLLM's words, which LangChain and LiteLLM parse
        "This model's maximum context length is 256 tokens. However, you requested 500 "
        "tokens (200 in the messages, 300 in the completion)."
    )
    assert error["param"] == "max_tokens"


def test_chat_too_long_names_the_parameter_used(gateway):
    messages = [{"role": "user", "content": "word " * 300}]
    with gateway.client() as c:
        r = c.post("/v1/chat/completions", json={"messages": messages})
        assert error_of(r, 400)["param"] == "messages"
        short = [{"role": "user", "content": "hi"}]
        r = c.post("/v1/chat/completions", json={"messages": short, "max_tokens": 257})
        assert error_of(r, 400)["param"] == "max_tokens"
        body = {"messages": short, "max_completion_tokens": 257}
        error = error_of(c.post("/v1/chat/completions", json=body), 400)
        assert (
            error["param"] == "max_completion_tokens"
            and "257 in the completion" in error["message"]
        )


def test_oversized_body_is_413(gateway):
    with gateway.client() as c:
        big = b'{"prompt": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'
        r = c.post("/v1/completions", content=big)
        assert "limit is 8388608 bytes" in error_of(r, 413)["message"]

        def chunks():  # no Content-Length: the limit is checked while reading
            yield b'{"prompt": "'
            for _ in range(9):
                yield b"a" * (1024 * 1024)

        r = c.post("/v1/completions", content=chunks())
        assert error_of(r, 413)["reason"] == "body_too_large"
        still_serving(c)


@pytest.mark.parametrize(
    ("code", "status", "error_type"),
    [
        ("queue_full", 503, "service_unavailable_error"),
        ("invalid_request", 400, "invalid_request_error"),
        ("engine_error", 500, "server_error"),
    ],
)
def test_engine_errors_get_their_status(gateway, code, status, error_type):
    with gateway.client() as c:
        for stream in (False, True):
            body = {"prompt": f"x [error:{code}]", "stream": stream}
            r = c.post("/v1/completions", json=body)
            error = error_of(r, status)
            assert error["type"] == error_type and error["reason"] == code
            assert "scripted" in error["message"]
            if status == 503:
                assert r.headers["retry-after"] == "1"
        if code == "queue_full":  # an engine's --max-waiting: vLLM's admission rejection
            assert admission_rejections(c) >= 2
        still_serving(c)


def test_engine_error_after_headers_is_a_final_event(gateway):
    body = {"prompt": "x [error-after:engine_error]", "stream": True}
    with gateway.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and error["reason"] == "engine_error"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts) == "Hello!"


def admission_rejections(client, reason: str = "max_num_queued_reqs") -> float:
    text = client.get("/metrics").text
    found = re.search(rf'^vllm:admission_rejections_total{{model_name="[^"]+",reason="{reason}"}}'
                      r" (\S+)$", text, re.M)  # fmt: skip
    assert found, f"no admission_rejections sample for {reason} in /metrics"
    return float(found.group(1))


def test_queue_full_is_503_with_retry_after(redis_url, info):
    running = start_gateway(redis_url, info, max_pending_requests=2)
    try:
        r = redis.Redis.from_url(redis_url)
        stream = f"{running.config.namespace}:requests"
        # Filler entries the scripted engine leaves queued (as unfinished requests are).
        fillers = [r.xadd(stream, {"filler": b"1"}) for _ in range(2)]
        with running.client() as c:
            response = c.post("/v1/completions", json={"prompt": "x"})
            error = error_of(response, 503)
            assert response.headers["retry-after"] == "1"
            assert "2 pending, limit 2" in error["message"] and error["reason"] == "queue_full"
            assert admission_rejections(c) == 1
            assert admission_rejections(c, "max_num_queued_tokens") == 0  # no such limit
            r.xdel(stream, *fillers)
            still_serving(c)
        r.close()
    finally:
        running.stop()


def test_redis_down_is_503_and_health_says_why(info):
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    running = start_gateway(dead_url, info, engine=False)
    try:
        with running.client() as c:
            error = error_of(c.post("/v1/completions", json={"prompt": "x"}), 503)
            assert "Redis" in error["message"]
            health = c.get("/health")
            assert health.status_code == 503 and "unreachable" in health.json()["reason"]
            assert c.get("/metrics").status_code == 200
    finally:
        running.stop()


def test_api_key(gateway):
    url = gateway.base_url
    with httpx.Client(base_url=url, timeout=10) as anonymous:
        assert error_of(anonymous.get("/v1/models"), 401)["reason"] == "missing_api_key"
        wrong = {"Authorization": "Bearer sk-wrong"}
        r = anonymous.post("/v1/completions", json={"prompt": "x"}, headers=wrong)
        assert error_of(r, 401)["type"] == "authentication_error"
        assert anonymous.get("/health").status_code in (200, 503)  # open
        assert anonymous.get("/metrics").status_code == 200  # open by default
    with gateway.client() as c:
        assert c.get("/v1/models").status_code == 200


def test_request_id_echoed_or_generated(gateway):
    with gateway.client() as c:
        r = c.get("/v1/models", headers={"X-Request-Id": "client-id-42"})
        assert r.headers["x-request-id"] == "client-id-42"
        r = c.get("/v1/models", headers={"X-Request-Id": "bad id\twith spaces" + "x" * 200})
        assert len(r.headers["x-request-id"]) == 32 and " " not in r.headers["x-request-id"]
        r = c.post("/v1/completions", content=b"{bad")
        assert r.status_code == 400 and len(r.headers["x-request-id"]) == 32
        with httpx.Client(base_url=gateway.base_url) as anonymous:
            assert "x-request-id" in anonymous.get("/v1/models").headers  # even on a 401


def test_client_disconnect_while_waiting_aborts_within_a_second(gateway):
    with gateway.client(timeout=httpx.Timeout(10, read=0.3)) as c:
        sent = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json={"prompt": "[hang]", "stream": True})
    wait_for_abort(gateway, sent)


def test_client_disconnect_mid_stream_aborts_within_a_second(gateway):
    gateway.engine.token_delay_s = 0.3
    body = {"prompt": "slow", "stream": True, "max_tokens": 60}
    with gateway.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        sent = time.monotonic()
    wait_for_abort(gateway, sent)
    (request,) = gateway.engine.received
    assert gateway.engine.aborts[0][1].request_ids == [request.request_id]


def wait_for_abort(gateway, since: float) -> None:
    deadline = since + 1.0
    while not gateway.engine.aborts and time.monotonic() < deadline + 0.5:
        time.sleep(0.01)
    assert gateway.engine.aborts, "no abort reached the aborts stream"
    arrived, abort = gateway.engine.aborts[0]
    assert arrived - since < 1.0
    assert abort.reason == "client disconnected"


def test_redis_restart_is_survived(info):
    from tests.integration.conftest import RedisServer

    server = RedisServer()
    server.start()
    running = start_gateway(server.url, info)
    try:
        with running.client() as c:
            still_serving(c)
            running.engine.stop()
            server.stop()
            error = error_of(c.post("/v1/completions", json={"prompt": "x"}), 503)
            assert "unreachable" in error["message"]
            assert c.get("/health").status_code == 503
            server.start()  # same port, empty data: the gateway reconnects by itself
            running.engine = ScriptedEngine(
                server.url, running.config.namespace, info.tokenizer
            ).start()
            still_serving(c)
    finally:
        running.stop()
        server.stop()
