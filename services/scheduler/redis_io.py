"""The scheduler's Redis traffic: the request stream (consumer group), the abort stream, the
per-gateway output streams, request status hashes and the engine status hash.

Every method raises `redis.RedisError` on a connection problem; the engine loop decides how to
back off. Nothing here holds scheduling state.

Reading the request stream: entries are delivered to this engine through the `engines` group
under the engine id as consumer name, and ACKed (then deleted, so that XLEN counts unfinished
requests) only when the request has finished. `read_own_pending` re-reads what this consumer
was given and never ACKed, so that a restart with the same engine id resumes its requests.
`claim_abandoned` takes over the pending entries of *dead* engines: consumers whose
`EngineStatus` key has expired (no status for `ENGINE_STATUS_TTL_S`). It uses XPENDING per dead
consumer + XCLAIM rather than XAUTOCLAIM, because XAUTOCLAIM picks entries by idle time alone,
and an entry stays idle for as long as a live engine works on it: a long request would be
stolen from a healthy engine. XCLAIM's `min_idle_time` makes two engines racing for the same
entries claim each one once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import (
    AbortRequest,
    GenerateRequest,
    OutputBatch,
    ProtocolError,
    TokenDelta,
    decode,
    encode,
)
from pagedserve.shared.status import (
    ENGINE_STATUS_TTL_S,
    REQUEST_STATUS_TTL_S,
    EngineStatus,
    to_fields,
)

logger = logging.getLogger(__name__)

OUTPUT_STREAM_MAXLEN = 100_000  # a dead gateway's stream stops growing here (approximately)


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One request-stream entry; `request` is None when the entry is unreadable or deleted."""

    entry_id: str
    request: GenerateRequest | None
    problem: str = ""


@dataclass(slots=True)
class StepWrites:
    """Everything one step writes, sent in one MULTI/EXEC so that a retry after a failure
    never duplicates output."""

    outputs: dict[str, list[TokenDelta]]  # gateway id -> deltas
    acked_entry_ids: list[str]
    statuses: dict[str, dict[str, str]]  # request id -> hash fields to set
    engine_status: EngineStatus | None = None  # the engine's, when it changed this step

    @classmethod
    def empty(cls) -> StepWrites:
        return cls({}, [], {})

    def __bool__(self) -> bool:
        return bool(
            self.outputs or self.acked_entry_ids or self.statuses or self.engine_status is not None
        )

    def set_status(self, request_id: str, **fields: object) -> None:
        self.statuses.setdefault(request_id, {}).update({k: str(v) for k, v in fields.items()})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry(entry_id: bytes | str, fields: dict | None) -> StreamEntry:
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    payload = (fields or {}).get(b"m")
    if payload is None:
        return StreamEntry(entry_id, None, "entry has no field 'm' (deleted?)")
    try:
        message = decode(payload)
    except ProtocolError as exc:
        return StreamEntry(entry_id, None, str(exc))
    if not isinstance(message, GenerateRequest):
        return StreamEntry(entry_id, None, f"entry is a {type(message).__name__}")
    problem = _routing_problem(message)
    if problem is not None:  # nobody to answer: dropped (logged) and ACKed
        return StreamEntry(entry_id, None, problem)
    return StreamEntry(entry_id, message)


def _routing_problem(request: GenerateRequest) -> str | None:
    """What makes a request impossible to answer: who it is and where its output goes. The
    rest of it is checked when it is queued (`request_validator.py`), and answered."""
    if not isinstance(request.request_id, str) or not request.request_id:
        return f"request_id must be a non-empty string, got {request.request_id!r}"
    if not isinstance(request.gateway_id, str):
        return f"gateway_id must be a string, got {request.gateway_id!r}"
    if isinstance(request.arrival_time, bool) or not isinstance(request.arrival_time, int | float):
        return f"arrival_time must be a number, got {request.arrival_time!r}"
    return None


class RedisIO:
    def __init__(self, redis: aioredis.Redis, keys: RedisKeys, engine_id: str) -> None:
        self.redis = redis
        self.keys = keys
        self.engine_id = engine_id
        self._abort_cursor = "0-0"

    async def setup(self) -> None:
        """Create the consumer group (from the stream's start, so that requests queued before
        any engine existed are served) and start reading aborts from now on."""
        try:
            await self.redis.xgroup_create(self.keys.requests, ENGINE_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        last = await self.redis.xrevrange(self.keys.aborts, count=1)
        self._abort_cursor = last[0][0].decode() if last else "0-0"

    # -- reading ---------------------------------------------------------------------------------

    async def read_own_pending(self, count: int = 256) -> list[StreamEntry]:
        """Entries delivered to this engine id earlier and never ACKed (a previous life)."""
        entries: list[StreamEntry] = []
        cursor = "0"
        while True:
            answer = await self.redis.xreadgroup(
                ENGINE_GROUP, self.engine_id, {self.keys.requests: cursor}, count=count
            )
            batch = answer[0][1] if answer else []
            if not batch:
                return entries
            entries.extend(_entry(entry_id, fields) for entry_id, fields in batch)
            cursor = entries[-1].entry_id

    async def claim_abandoned(self, min_idle_ms: int, count: int = 256) -> list[StreamEntry]:
        """Entries pending at dead engines (status expired) for at least `min_idle_ms`,
        claimed for this engine. A dead consumer left with nothing pending is removed."""
        claimed: list[StreamEntry] = []
        for consumer in await self.redis.xinfo_consumers(self.keys.requests, ENGINE_GROUP):
            name = _text(consumer["name"])
            if name == self.engine_id or await self.redis.exists(self.keys.engine(name)):
                continue
            if consumer["pending"]:
                claimed += await self._claim_from(name, min_idle_ms, count)
            else:
                await self.redis.xgroup_delconsumer(self.keys.requests, ENGINE_GROUP, name)
        return claimed

    async def _claim_from(self, consumer: str, min_idle_ms: int, count: int) -> list[StreamEntry]:
        pending = await self.redis.xpending_range(
            self.keys.requests, ENGINE_GROUP, min="-", max="+", count=count,
            consumername=consumer, idle=min_idle_ms,
        )  # fmt: skip
        entry_ids = [p["message_id"] for p in pending]
        if not entry_ids:
            return []
        answer = await self.redis.xclaim(
            self.keys.requests, ENGINE_GROUP, self.engine_id, min_idle_ms, entry_ids
        )
        logger.warning("claimed %d un-ACKed request(s) of dead engine %s", len(answer), consumer)
        return [_entry(entry_id, fields) for entry_id, fields in answer]

    async def read_new(self, count: int, block_ms: int | None) -> list[StreamEntry]:
        if count <= 0:
            return []
        answer = await self.redis.xreadgroup(
            ENGINE_GROUP, self.engine_id, {self.keys.requests: ">"}, count=count, block=block_ms
        )
        if not answer:
            return []
        return [_entry(entry_id, fields) for entry_id, fields in answer[0][1]]

    async def read_aborts(self, count: int = 512) -> list[AbortRequest]:
        answer = await self.redis.xread({self.keys.aborts: self._abort_cursor}, count=count)
        aborts = []
        for _, entries in answer or []:
            for entry_id, fields in entries:
                self._abort_cursor = entry_id.decode()
                try:
                    message = decode(fields.get(b"m", b""))
                except ProtocolError as exc:
                    logger.error("unreadable abort entry %s: %s", self._abort_cursor, exc)
                    continue
                if isinstance(message, AbortRequest):
                    aborts.append(message)
        return aborts

    async def missing_gateways(self, gateway_ids: set[str]) -> set[str]:
        """The gateways among `gateway_ids` whose heartbeat key has expired."""
        ordered = sorted(gateway_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for gateway_id in ordered:
                pipe.exists(self.keys.gateway(gateway_id))
            found = await pipe.execute()
        return {g for g, exists in zip(ordered, found, strict=True) if not exists}

    # -- writing ---------------------------------------------------------------------------------

    async def write_step(self, writes: StepWrites) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            for gateway_id, deltas in writes.outputs.items():
                pipe.xadd(
                    self.keys.output(gateway_id),
                    {"m": encode(OutputBatch(self.engine_id, deltas))},
                    maxlen=OUTPUT_STREAM_MAXLEN,
                    approximate=True,
                )
            if writes.acked_entry_ids:
                pipe.xack(self.keys.requests, ENGINE_GROUP, *writes.acked_entry_ids)
                pipe.xdel(self.keys.requests, *writes.acked_entry_ids)
            for request_id, fields in writes.statuses.items():
                key = self.keys.request(request_id)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, REQUEST_STATUS_TTL_S)
            if writes.engine_status is not None:
                self._queue_engine_status(pipe, writes.engine_status)
            try:
                await pipe.execute()
            except ResponseError as exc:
                # MULTI/EXEC ran every other command; an ACK of an entry that a restarted Redis
                # no longer holds has nothing left to do.
                await self._recreate_group_if_lost(exc)

    async def _recreate_group_if_lost(self, exc: ResponseError) -> None:
        """After a Redis restart without persistence the stream and its group are gone:
        create them again. Any other error is raised."""
        if "NOGROUP" not in str(exc):
            raise exc
        logger.warning("the request stream's consumer group is gone (Redis restarted?): recreating")
        await self.setup()

    async def write_engine_status(self, status: EngineStatus) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            self._queue_engine_status(pipe, status)
            await pipe.execute()

    def _queue_engine_status(self, pipe: aioredis.client.Pipeline, status: EngineStatus) -> None:
        key = self.keys.engine(self.engine_id)
        pipe.hset(key, mapping=to_fields(status))
        pipe.expire(key, ENGINE_STATUS_TTL_S)
        pipe.sadd(self.keys.engines, self.engine_id)
