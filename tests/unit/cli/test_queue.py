"""`pagedserve queue` against a real Redis holding records written the way the services write
them (shared/keys.py names, shared/status.py records, protocol-encoded stream entries)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from pagedserve.services.cli import main
from pagedserve.services.cli.queue_reader import QueueError, connect, read_queue, read_request
from pagedserve.services.cli.queue_view import (
    format_age,
    format_table,
    render_queue,
    render_request,
)
from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, encode
from pagedserve.shared.status import EngineStatus, RequestStatus, to_fields

NS = "qtest"
KEYS = RedisKeys(NS)


def add_request(client: redis.Redis, request_id: str) -> str:
    request = GenerateRequest(request_id, [1, 2, 3], SamplingParams(), gateway_id="gw0")
    return client.xadd(KEYS.requests, {"m": encode(request)}).decode()


def make_queue(client: redis.Redis, num_queued: int, num_taken: dict[str, int]) -> None:
    """`num_queued` requests in the stream, of which engines take `num_taken[engine]` each."""
    client.xgroup_create(KEYS.requests, ENGINE_GROUP, id="0", mkstream=True)
    for i in range(num_queued):
        add_request(client, f"req-{i}")
    for engine_id, count in num_taken.items():
        client.xreadgroup(ENGINE_GROUP, engine_id, {KEYS.requests: ">"}, count=count)


def write_engine(client: redis.Redis, engine_id: str, age_s: float = 0.5, **fields) -> None:
    now = client.time()[0]
    status = EngineStatus(engine_id=engine_id, time=now - age_s, workers_alive=True, **fields)
    client.sadd(KEYS.engines, engine_id)
    client.hset(KEYS.engine(engine_id), mapping=to_fields(status))


def test_overview_counts_depth_pending_and_undelivered(redis_client: redis.Redis) -> None:
    make_queue(redis_client, num_queued=5, num_taken={"engine0": 2, "engine1": 1})
    snap = read_queue(redis_client, NS)
    stream = snap["stream"]
    assert stream["length"] == 5
    assert stream["pending"] == 3
    assert stream["undelivered"] == 2
    assert stream["oldest_pending_age_s"] is not None and stream["oldest_pending_age_s"] < 5
    assert {c["name"]: c["pending"] for c in snap["consumers"]} == {"engine0": 2, "engine1": 1}
    in_flight = {r["request_id"]: r["engine_id"] for r in snap["in_flight"]}
    assert in_flight == {"req-0": "engine0", "req-1": "engine0", "req-2": "engine1"}


def test_oldest_undelivered_age_uses_the_stream_id_time(redis_client: redis.Redis) -> None:
    redis_client.xgroup_create(KEYS.requests, ENGINE_GROUP, id="0", mkstream=True)
    old_ms = (redis_client.time()[0] - 90) * 1000
    request = GenerateRequest("old", [1], SamplingParams())
    redis_client.xadd(KEYS.requests, {"m": encode(request)}, id=f"{old_ms}-0")
    stream = read_queue(redis_client, NS)["stream"]
    assert 89 <= stream["oldest_undelivered_age_s"] <= 95
    assert stream["oldest_pending_age_s"] is None


def test_finished_requests_leave_pending(redis_client: redis.Redis) -> None:
    make_queue(redis_client, num_queued=2, num_taken={"engine0": 2})
    entry_ids = [e[0] for e in redis_client.xrange(KEYS.requests)]
    redis_client.xack(KEYS.requests, ENGINE_GROUP, entry_ids[0])
    snap = read_queue(redis_client, NS)
    assert snap["stream"]["pending"] == 1
    assert [r["request_id"] for r in snap["in_flight"]] == ["req-1"]


def test_empty_namespace_reads_as_zeros(redis_client: redis.Redis) -> None:
    snap = read_queue(redis_client, NS)
    assert snap["stream"]["length"] == 0
    assert snap["stream"]["pending"] == 0
    assert snap["consumers"] == snap["in_flight"] == snap["engines"] == snap["gateways"] == []
    text = render_queue(snap)
    assert "REQUEST STREAM" in text and "(none)" in text


def test_engines_show_load_kv_and_heartbeat(redis_client: redis.Redis) -> None:
    write_engine(redis_client, "engine0", num_running=3, num_waiting=7, kv_usage=0.25,
                 num_free_blocks=75, num_total_blocks=100, host="node-a")  # fmt: skip
    write_engine(redis_client, "engine1", age_s=60)  # stale heartbeat
    redis_client.sadd(KEYS.engines, "engine2")  # registered, status expired
    engines = {e["engine_id"]: e for e in read_queue(redis_client, NS)["engines"]}
    assert engines["engine0"]["alive"] is True
    assert (engines["engine0"]["num_running"], engines["engine0"]["num_waiting"]) == (3, 7)
    assert 0.4 <= engines["engine0"]["heartbeat_age_s"] < 3
    assert engines["engine1"]["alive"] is False
    assert engines["engine2"] == {"engine_id": "engine2", "alive": False, "heartbeat_age_s": None,
                                  "num_cached_blocks": 0, "num_routed": 0}  # fmt: skip
    text = render_queue(read_queue(redis_client, NS))
    engine0_line = next(
        line for line in text.splitlines() if line.startswith("engine0  node-a  yes")
    )
    assert "25.0%" in engine0_line and "75/100" in engine0_line
    assert "no (status expired)" in text


def test_engines_show_cached_blocks_and_routed_queue(redis_client: redis.Redis) -> None:
    write_engine(redis_client, "engine0", num_running=1, num_waiting=0)
    redis_client.sadd(KEYS.cache_summary("engine0"), b"a" * 8, b"b" * 8, b"c" * 8)
    for i in range(2):
        redis_client.xadd(KEYS.routed_requests("engine0"), {"m": f"r{i}"})
    redis_client.sadd(KEYS.engines, "engine1")  # dead, with a routed request left
    redis_client.xadd(KEYS.routed_requests("engine1"), {"m": "r"})
    engines = {e["engine_id"]: e for e in read_queue(redis_client, NS)["engines"]}
    assert (engines["engine0"]["num_cached_blocks"], engines["engine0"]["num_routed"]) == (3, 2)
    assert (engines["engine1"]["num_cached_blocks"], engines["engine1"]["num_routed"]) == (0, 1)
    text = render_queue(read_queue(redis_client, NS))
    assert "cached blocks" in text and "routed" in text
    engine0_line = next(line for line in text.splitlines() if line.startswith("engine0 "))
    assert engine0_line.split()[-5:-3] == ["3", "2"], engine0_line  # then "N.N s ago"


def test_requests_routed_to_an_engine_count_in_the_queue_and_in_flight(
    redis_client: redis.Redis,
) -> None:
    make_queue(redis_client, num_queued=1, num_taken={})  # one on the shared stream, untaken
    write_engine(redis_client, "engine0")
    routed = KEYS.routed_requests("engine0")
    redis_client.xgroup_create(routed, ENGINE_GROUP, id="0", mkstream=True)
    for request_id in ("routed-0", "routed-1"):
        request = GenerateRequest(request_id, [1, 2], SamplingParams(), gateway_id="gw0")
        redis_client.xadd(routed, {"m": encode(request)})
    redis_client.xreadgroup(ENGINE_GROUP, "engine0", {routed: ">"}, count=1)
    snap = read_queue(redis_client, NS)
    stream = snap["stream"]
    assert (stream["length"], stream["pending"], stream["undelivered"]) == (3, 1, 2)
    assert stream["routed_keys"] == [routed]
    assert [r["request_id"] for r in snap["in_flight"]] == ["routed-0"]
    assert snap["consumers"] == [
        {"name": "engine0", "pending": 1, "idle_s": snap["consumers"][0]["idle_s"]}
    ]


def test_gateways_alive_by_heartbeat_key(redis_client: redis.Redis) -> None:
    redis_client.sadd(KEYS.gateways, "gw0", "gw1")
    redis_client.set(KEYS.gateway("gw0"), "1", ex=10)
    gateways = {g["gateway_id"]: g for g in read_queue(redis_client, NS)["gateways"]}
    assert gateways["gw0"]["alive"] is True and 0 < gateways["gw0"]["ttl_s"] <= 10
    assert gateways["gw1"]["alive"] is False


def test_request_timeline(redis_client: redis.Redis) -> None:
    t0 = time.time()
    status = RequestStatus(
        "abc", "finished", gateway_id="gw0", engine_id="engine0", num_prompt_tokens=12,
        num_output_tokens=30, queued_at=t0, scheduled_at=t0 + 0.010, first_token_at=t0 + 0.050,
        finished_at=t0 + 0.900, finish_reason="length",
    )  # fmt: skip
    redis_client.hset(KEYS.request("abc"), mapping=to_fields(status))
    read = read_request(redis_client, NS, "abc")
    assert read == status
    text = render_request(read)
    assert "finished (length)" in text
    assert "+10 ms" in text and "+50 ms" in text and "+900 ms" in text


def test_unknown_request_id_is_a_clear_error(redis_client: redis.Redis) -> None:
    with pytest.raises(QueueError, match=r"no request 'nope' in namespace 'qtest'.*qtest:req:nope"):
        read_request(redis_client, NS, "nope")


def test_unreachable_redis_is_a_clear_error() -> None:
    with pytest.raises(QueueError, match=r"cannot reach Redis at redis://127.0.0.1:1/0"):
        connect("redis://127.0.0.1:1/0")


def test_cli_json_and_exit_codes(redis_server, redis_client, capsys) -> None:
    make_queue(redis_client, num_queued=3, num_taken={"engine0": 1})
    assert main(["queue", "--redis-url", redis_server.url, "--namespace", NS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stream"]["length"] == 3 and out["stream"]["pending"] == 1
    assert main(["queue", "--redis-url", redis_server.url, "--namespace", NS, "show", "x"]) == 1
    assert "no request 'x'" in capsys.readouterr().err
    assert main(["queue", "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err


def test_format_helpers() -> None:
    assert format_table(["a", "bb"], [[1, 2], [333, 4]]).splitlines() == [
        "a    bb",
        "1    2",
        "333  4",
    ]
    assert format_table(["a"], []).endswith("(none)")
    assert [format_age(x) for x in (None, 0.25, 3, 600, 10800)] == [
        "-", "250 ms", "3.0 s", "10.0 min", "3.0 h"
    ]  # fmt: skip
