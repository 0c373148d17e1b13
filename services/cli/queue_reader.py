"""What is in the Redis queue right now, and one request's record: the data behind
`pagedserve queue`.

Reads only; every number comes from keys named in `shared/keys.py`, so the same facts can be
read with `redis-cli` (the README lists the commands).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

import redis

from pagedserve.shared.config import RedisConfig, env_default
from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import GenerateRequest, ProtocolError, decode
from pagedserve.shared.redis_client import RedisTarget, sync_redis
from pagedserve.shared.status import ENGINE_STATUS_TTL_S, EngineStatus, RequestStatus, from_fields

MAX_IN_FLIGHT_LISTED = 20
MAX_COUNTED = 100_000  # undelivered entries counted one by one on Redis < 7


class QueueError(RuntimeError):
    """Something the user can fix: an unreachable Redis, an unknown request id."""


def default_redis_url() -> str:
    return os.environ.get("REDIS_URL") or env_default("redis_url", RedisConfig().url)


def connect(url: str, sentinel: str | None = None) -> redis.Redis:
    """A client that answered PING, or `QueueError` saying which Redis failed and why."""
    try:
        target = RedisTarget.of(url, sentinel)
    except ValueError as exc:
        raise QueueError(str(exc)) from exc
    try:
        client = sync_redis(target, socket_connect_timeout=2, socket_timeout=5)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, ValueError) as exc:
        raise QueueError(f"cannot reach Redis at {target.describe()}: {exc}") from exc
    return client


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _redis_now(client: redis.Redis) -> float:
    """Redis's clock, so that ages of stream ids do not depend on this machine's clock."""
    seconds, micros = client.time()
    return seconds + micros / 1e6


def _id_age_s(entry_id: str | None, now: float) -> float | None:
    if not entry_id:
        return None
    return max(0.0, now - int(entry_id.split("-")[0]) / 1000)


def _read_group(client: redis.Redis, stream: str) -> dict[str, Any] | None:
    if not client.exists(stream):
        return None
    for group in client.xinfo_groups(stream):
        if _text(group["name"]) == ENGINE_GROUP:
            return {k: _text(v) if isinstance(v, bytes) else v for k, v in group.items()}
    return None


def _oldest_undelivered_id(client: redis.Redis, stream: str, group: dict | None) -> str | None:
    start = "-" if group is None else f"({group['last-delivered-id']}"
    entries = client.xrange(stream, min=start, max="+", count=1)
    return _text(entries[0][0]) if entries else None


def _count_after(client: redis.Redis, stream: str, entry_id: str) -> int:
    """Entries after `entry_id`, counted up to MAX_COUNTED (a bound on the work done)."""
    return len(client.xrange(stream, min=f"({entry_id}", max="+", count=MAX_COUNTED))


def request_streams(client: redis.Redis, keys: RedisKeys) -> list[str]:
    """The shared request stream, then each registered engine's routed stream."""
    engine_ids = sorted(_text(e) for e in client.smembers(keys.engines))
    return [keys.requests, *(keys.routed_requests(e) for e in engine_ids)]


def read_stream(client: redis.Redis, keys: RedisKeys, now: float) -> dict[str, Any]:
    """Depth of the request streams (shared and routed, summed) and of the engines' group."""
    parts = [_read_one_stream(client, s, now) for s in request_streams(client, keys)]
    undelivered = [p["undelivered"] for p in parts]
    return {
        "key": keys.requests,
        "routed_keys": [p["key"] for p in parts[1:] if p["length"]],
        "length": sum(p["length"] for p in parts),
        "group": parts[0]["group"],
        "undelivered": None if None in undelivered else sum(undelivered),
        "pending": sum(p["pending"] for p in parts),
        "oldest_undelivered_age_s": _oldest(p["oldest_undelivered_age_s"] for p in parts),
        "oldest_pending_age_s": _oldest(p["oldest_pending_age_s"] for p in parts),
    }


def _oldest(ages: Iterable[float | None]) -> float | None:
    known = [a for a in ages if a is not None]
    return max(known) if known else None


def _read_one_stream(client: redis.Redis, stream: str, now: float) -> dict[str, Any]:
    group = _read_group(client, stream)
    summary = client.xpending(stream, ENGINE_GROUP) if group else {"pending": 0, "min": None}
    undelivered_id = (
        _oldest_undelivered_id(client, stream, group) if client.exists(stream) else None
    )
    length = int(client.xlen(stream))
    lag = group.get("lag") if group else length
    if group and lag is None:  # Redis < 7 has no lag, and 7+ gives none after an XDEL
        lag = _count_after(client, stream, group["last-delivered-id"])
    return {
        "key": stream,
        "length": length,
        "group": ENGINE_GROUP if group else None,
        "undelivered": int(lag) if lag is not None else None,
        "pending": int(summary["pending"]),
        "oldest_undelivered_age_s": _id_age_s(undelivered_id, now),
        "oldest_pending_age_s": _id_age_s(_text(summary["min"]) if summary["min"] else None, now),
    }


def read_consumers(client: redis.Redis, keys: RedisKeys) -> list[dict[str, Any]]:
    """Pending (delivered, not yet finished) requests per engine of group `engines`, over
    every request stream."""
    consumers: dict[str, dict[str, Any]] = {}
    for stream in request_streams(client, keys):
        if _read_group(client, stream) is None:
            continue
        for c in client.xinfo_consumers(stream, ENGINE_GROUP):
            name = _text(c["name"])
            row = consumers.setdefault(name, {"name": name, "pending": 0, "idle_s": None})
            row["pending"] += int(c["pending"])
            idle_s = int(c["idle"]) / 1000
            row["idle_s"] = idle_s if row["idle_s"] is None else min(row["idle_s"], idle_s)
    return [consumers[name] for name in sorted(consumers)]


def read_in_flight(client: redis.Redis, keys: RedisKeys, now: float) -> list[dict[str, Any]]:
    """The oldest delivered-but-unfinished requests of every request stream, with the
    request id from each entry."""
    rows = []
    for stream in request_streams(client, keys):
        if _read_group(client, stream) is None:
            continue
        for item in client.xpending_range(stream, ENGINE_GROUP, "-", "+", MAX_IN_FLIGHT_LISTED):
            entry_id = _text(item["message_id"])
            request_id = _request_id_of(client, stream, entry_id)
            rows.append(
                {
                    "request_id": request_id,
                    "entry_id": entry_id,
                    "engine_id": _text(item["consumer"]),
                    "age_s": _id_age_s(entry_id, now),
                    "deliveries": int(item["times_delivered"]),
                    "state": _request_state(client, keys, request_id),
                }
            )
    rows.sort(key=lambda row: -(row["age_s"] or 0.0))
    return rows[:MAX_IN_FLIGHT_LISTED]


def _request_id_of(client: redis.Redis, stream: str, entry_id: str) -> str:
    entries = client.xrange(stream, min=entry_id, max=entry_id, count=1)
    if not entries:
        return "?"  # trimmed from the stream while still pending
    try:
        message = decode(entries[0][1][b"m"])
    except (KeyError, ProtocolError):
        return "?"
    return message.request_id if isinstance(message, GenerateRequest) else "?"


def _request_state(client: redis.Redis, keys: RedisKeys, request_id: str) -> str:
    state = client.hget(keys.request(request_id), "state")
    return _text(state) if state is not None else ""


def read_engines(client: redis.Redis, keys: RedisKeys, now: float) -> list[dict[str, Any]]:
    """Every registered engine's last status, the blocks its published cache summary holds
    and the requests routed to it and not finished; one whose record expired shows as not
    alive (its routed requests wait for a live engine to claim them)."""
    rows = []
    for engine_id in sorted(_text(e) for e in client.smembers(keys.engines)):
        routing = {
            "num_cached_blocks": int(client.scard(keys.cache_summary(engine_id))),
            "num_routed": int(client.xlen(keys.routed_requests(engine_id))),
        }
        fields = client.hgetall(keys.engine(engine_id))
        if not fields:
            rows.append(
                {"engine_id": engine_id, "alive": False, "heartbeat_age_s": None, **routing}
            )
            continue
        status = from_fields(EngineStatus, fields)
        age = max(0.0, now - status.time)
        row = asdict(status)
        row.update(heartbeat_age_s=age, alive=age <= ENGINE_STATUS_TTL_S, **routing)
        rows.append(row)
    return rows


def read_gateways(client: redis.Redis, keys: RedisKeys) -> list[dict[str, Any]]:
    rows = []
    for gateway_id in sorted(_text(g) for g in client.smembers(keys.gateways)):
        ttl = int(client.ttl(keys.gateway(gateway_id)))  # -2: gone, -1: no expiry
        rows.append({"gateway_id": gateway_id, "alive": ttl != -2, "ttl_s": max(ttl, 0)})
    return rows


def read_queue(client: redis.Redis, namespace: str) -> dict[str, Any]:
    """Everything `pagedserve queue` shows, as one JSON-ready dict."""
    keys = RedisKeys(namespace)
    now = _redis_now(client)
    return {
        "namespace": namespace,
        "time": now,
        "stream": read_stream(client, keys, now),
        "consumers": read_consumers(client, keys),
        "in_flight": read_in_flight(client, keys, now),
        "engines": read_engines(client, keys, now),
        "gateways": read_gateways(client, keys),
    }


def read_request(client: redis.Redis, namespace: str, request_id: str) -> RequestStatus:
    """One request's status record, or `QueueError` when the id is unknown (or expired)."""
    key = RedisKeys(namespace).request(request_id)
    fields = client.hgetall(key)
    if not fields:
        raise QueueError(
            f"no request {request_id!r} in namespace {namespace!r} (key {key} does not exist): "
            "the id is unknown, or its record expired (kept --finished-request-ttl seconds, 600 by "
            "default, after it finished)"
        )
    return from_fields(RequestStatus, fields)
