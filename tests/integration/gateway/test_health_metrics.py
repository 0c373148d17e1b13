"""/health from the engines' status records, /metrics under vLLM's names."""

from __future__ import annotations

import re
import time

import pytest
import redis

from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus, to_fields

pytestmark = pytest.mark.integration


def publish(gateway, status: EngineStatus) -> None:
    keys = RedisKeys(gateway.config.namespace)
    r = redis.Redis.from_url(gateway.config.redis_url)
    r.sadd(keys.engines, status.engine_id)
    r.hset(keys.engine(status.engine_id), mapping=to_fields(status))
    r.close()


def eventually(get, check, timeout_s: float = 10.0):
    """`get()` once `check` holds for it: /health and /metrics answer from a view of Redis
    refreshed every 0.25 s, so a record just written shows within a moment, not at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = get()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_health_follows_engine_status(gateway):
    with gateway.client() as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["reason"] == "no engine has registered"
        publish(gateway, EngineStatus("e1", time=time.time() - 60, workers_alive=True))
        r = eventually(lambda: c.get("/health"), lambda r: "e1" in r.text)
        assert r.status_code == 503 and "e1: status 60" in r.json()["reason"]
        publish(gateway, EngineStatus("e1", time=time.time(), workers_alive=False))
        r = eventually(lambda: c.get("/health"), lambda r: "workers_alive=False" in r.text)
        assert r.status_code == 503 and "workers_alive=False" in r.json()["reason"]
        publish(gateway, EngineStatus("e1", time=time.time(), workers_alive=True))
        r = eventually(lambda: c.get("/health"), lambda r: r.status_code == 200)
        assert r.status_code == 200 and r.json() == {"status": "ok", "engines": ["e1"]}


def test_gateway_heartbeat_registers_it(gateway):
    keys = RedisKeys(gateway.config.namespace)
    r = redis.Redis.from_url(gateway.config.redis_url)
    deadline = time.monotonic() + 5
    while not r.exists(keys.gateway(gateway.config.gateway_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 < r.ttl(keys.gateway(gateway.config.gateway_id)) <= 10
    assert r.sismember(keys.gateways, gateway.config.gateway_id)
    r.close()


def test_request_status_and_stream_cleanup(gateway):
    with gateway.client() as c:
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}).status_code == 200
    keys = RedisKeys(gateway.config.namespace)
    r = redis.Redis.from_url(gateway.config.redis_url)
    (request,) = gateway.engine.received
    status = r.hgetall(keys.request(request.request_id))
    assert (
        status[b"state"] == b"queued"
        and status[b"gateway_id"].decode() == gateway.config.gateway_id
    )
    assert 0 < r.ttl(keys.request(request.request_id)) <= 24 * 3600
    deadline = time.monotonic() + 2  # consumed output entries are deleted
    while r.xlen(keys.output(gateway.config.gateway_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.xlen(keys.output(gateway.config.gateway_id)) == 0
    r.close()


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_metrics_names_and_values(gateway):
    publish(gateway, EngineStatus(
        "e1", time=time.time(), workers_alive=True, num_running=3, num_waiting=2, kv_usage=0.25,
        prefix_cache_queries=100, prefix_cache_hits=40, num_preemptions=1,
        scheduling_s=0.5, step_in_flight_s=9.0, worker_execute_s=8.25,
        spec_num_drafts=4, spec_num_draft_tokens=12, spec_num_accepted_tokens=7,
        num_speculative_tokens=3, spec_accepted_per_pos="4,2,1",
    ))  # fmt: skip
    with gateway.client() as c:
        c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
        c.post("/v1/completions", json={"prompt": "x", "max_tokens": 60, "stop": ["world"]})
        text = eventually(
            # the engine gauges show once the status view has read the record
            lambda: c.get("/metrics").text,
            lambda t: 'vllm:num_requests_running{engine="e1"' in t,
        )
    assert sample(text, "vllm:num_requests_running") == 3
    assert sample(text, "vllm:num_requests_waiting") == 2
    assert sample(text, "vllm:kv_cache_usage_perc") == 0.25
    assert sample(text, "vllm:prefix_cache_queries_total") == 100
    assert sample(text, "vllm:prefix_cache_hits_total") == 40
    assert sample(text, "vllm:num_preemptions_total") == 1
    assert sample(text, "pagedserve:worker_execute_seconds_total") == 8.25
    assert sample(text, "pagedserve:step_in_flight_seconds_total") == 9.0
    assert sample(text, "pagedserve:scheduling_seconds_total") == 0.5
    assert sample(text, "vllm:spec_decode_num_drafts_total") == 4
    assert sample(text, "vllm:spec_decode_num_draft_tokens_total") == 12
    assert sample(text, "vllm:spec_decode_num_accepted_tokens_total") == 7
    assert sample(text, "vllm:time_to_first_token_seconds_count") == 2
    assert sample(text, "vllm:e2e_request_latency_seconds_count") == 2
    assert sample(text, "vllm:inter_token_latency_seconds_count") > 0
    assert sample(text, "vllm:prompt_tokens_total") > 0
    assert sample(text, "vllm:generation_tokens_total") >= 4
    assert re.search(r'^vllm:request_success_total\{engine="[^"]+",finished_reason="length"', text,
                     re.M)  # fmt: skip
    assert re.search(r'^vllm:request_success_total\{engine="[^"]+",finished_reason="stop"', text,
                     re.M)  # fmt: skip
    per_pos = re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{engine="e1",'
                         r'model_name="[^"]+",position="(\d)"\} (\S+)$', text, re.M)  # fmt: skip
    assert per_pos == [("0", "4.0"), ("1", "2.0"), ("2", "1.0")]
    assert "# TYPE vllm:request_queue_time_seconds histogram" in text


def test_metrics_count_the_restarts_serve_published(gateway):
    keys = RedisKeys(gateway.config.namespace)
    r = redis.Redis.from_url(gateway.config.redis_url)
    try:
        with gateway.client() as c:
            assert "pagedserve:process_restarts_total{" not in c.get("/metrics").text
            r.hset(keys.process_restarts, mapping={"worker0": 2, "redis": 1})
            text = eventually(lambda: c.get("/metrics").text, lambda t: "restarts_total{" in t)
    finally:
        r.delete(keys.process_restarts)
        r.close()
    assert 'pagedserve:process_restarts_total{process="worker0"} 2.0' in text
    assert 'pagedserve:process_restarts_total{process="redis"} 1.0' in text
