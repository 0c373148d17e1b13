"""The scheduler's Redis traffic: the request streams (consumer group), the abort stream, the
per-gateway output streams, request status hashes and the engine status hash.

An engine reads two request streams through the `engines` group: the shared one, which any
engine may take an entry from, and its own routed stream, where gateways that route by cache or
load put the requests they chose this engine for (`services/gateway/router.py`). An entry is
ACKed on the stream it came from (`StreamEntry.stream`).

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
entries claim each one once. A dead engine's routed stream may also hold entries never
delivered to it: a live engine reads those through the group (`>`), which hands each entry to
one reader only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

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
    FINAL_STATES,
    FINISHED_REQUEST_STATUS_TTL_S,
    REQUEST_STATUS_TTL_S,
    EngineStatus,
    to_fields,
)

logger = logging.getLogger(__name__)

OUTPUT_STREAM_MAXLEN = 100_000  # a dead gateway's stream stops growing here (approximately)
ABORT_READ_COUNT = 512  # aborts read at most per read


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One request-stream entry; `request` is None when the entry is unreadable or deleted."""

    stream: str  # the request stream it was read from, where it is ACKed
    entry_id: str
    request: GenerateRequest | None
    problem: str = ""


@dataclass(slots=True)
class StepWrites:
    """Everything one step writes, sent in one MULTI/EXEC so that a retry after a failure
    never duplicates output."""

    outputs: dict[str, list[TokenDelta]]  # gateway id -> deltas
    acked: dict[str, list[str]]  # request stream -> entry ids finished
    statuses: dict[str, dict[str, str]]  # request id -> hash fields to set
    # engine status fields written with the step (its gauges, or the whole record when the
    # engine has emptied: `StatusReporter.after_step`); the whole record also goes every
    # STATUS_INTERVAL_S on its own
    engine_fields: dict[str, str] | None = None

    @classmethod
    def empty(cls) -> StepWrites:
        return cls({}, {}, {})

    def __bool__(self) -> bool:
        return bool(self.outputs or self.acked or self.statuses or self.engine_fields is not None)

    def set_status(self, request_id: str, **fields: object) -> None:
        self.statuses.setdefault(request_id, {}).update({k: str(v) for k, v in fields.items()})

    def ack(self, stream: str, entry_id: str) -> None:
        self.acked.setdefault(stream, []).append(entry_id)

    @property
    def num_commands(self) -> int:
        """The Redis commands `RedisIO.write_step` sends for these writes."""
        engine = 3 if self.engine_fields is not None else 0  # HSET, EXPIRE, SADD
        return len(self.outputs) + 2 * len(self.acked) + 2 * len(self.statuses) + engine


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry(stream: str, entry_id: bytes | str, fields: dict | None) -> StreamEntry:
    entry_id = _text(entry_id)
    payload = (fields or {}).get(b"m")
    if payload is None:
        return StreamEntry(stream, entry_id, None, "entry has no field 'm' (deleted?)")
    try:
        message = decode(payload)
    except ProtocolError as exc:
        return StreamEntry(stream, entry_id, None, str(exc))
    if not isinstance(message, GenerateRequest):
        return StreamEntry(stream, entry_id, None, f"entry is a {type(message).__name__}")
    problem = _routing_problem(message)
    if problem is not None:  # nobody to answer: dropped (logged) and ACKed
        return StreamEntry(stream, entry_id, None, problem)
    return StreamEntry(stream, entry_id, message)


def _entries(answer: list | None) -> list[StreamEntry]:
    """The entries of an XREADGROUP / XREAD answer, over every stream in it."""
    return [
        _entry(_text(stream), entry_id, fields)
        for stream, batch in answer or []
        for entry_id, fields in batch
    ]


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
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: RedisKeys,
        engine_id: str,
        finished_request_ttl_s: int = FINISHED_REQUEST_STATUS_TTL_S,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.engine_id = engine_id
        self.finished_request_ttl_s = finished_request_ttl_s
        self.own_stream = keys.routed_requests(engine_id)
        self.streams = (keys.requests, self.own_stream)  # what this engine reads
        self._abort_cursor = "0-0"

    async def setup(self) -> None:
        """Create the consumer group on both request streams (from the start, so that requests
        queued before any engine existed are served) and start reading aborts from now on."""
        for stream in self.streams:
            await self._create_group(stream)
        last = await self.redis.xrevrange(self.keys.aborts, count=1)
        self._abort_cursor = last[0][0].decode() if last else "0-0"

    # -- reading ---------------------------------------------------------------------------------

    async def read_own_pending(self, count: int = 256) -> list[StreamEntry]:
        """Entries delivered to this engine id earlier and never ACKed (a previous life)."""
        entries: list[StreamEntry] = []
        for stream in self.streams:
            cursor = "0"
            while True:
                answer = await self.redis.xreadgroup(
                    ENGINE_GROUP, self.engine_id, {stream: cursor}, count=count
                )
                batch = _entries(answer)
                if not batch:
                    break
                entries += batch
                cursor = batch[-1].entry_id
        return entries

    async def claim_abandoned(self, min_idle_ms: int, count: int = 256) -> list[StreamEntry]:
        """Entries pending at dead engines (status expired) for at least `min_idle_ms`, on
        every request stream, and entries routed to dead engines and never delivered, claimed
        for this engine. A dead consumer left with nothing pending is removed."""
        other_ids = sorted(
            _text(m)
            for m in await self.redis.smembers(self.keys.engines)
            if _text(m) != self.engine_id
        )
        dead_ids = [e for e in other_ids if not await self.redis.exists(self.keys.engine(e))]
        claimed: list[StreamEntry] = []
        for stream in [self.keys.requests, *map(self.keys.routed_requests, other_ids)]:
            claimed += await self._claim_dead_consumers(stream, min_idle_ms, count)
        for engine_id in dead_ids:
            claimed += await self._take_undelivered(engine_id, count)
        return claimed

    async def _claim_dead_consumers(
        self, stream: str, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        try:
            consumers = await self.redis.xinfo_consumers(stream, ENGINE_GROUP)
        except ResponseError:  # no such stream or group: nobody was given anything there
            return []
        claimed: list[StreamEntry] = []
        for consumer in consumers:
            name = _text(consumer["name"])
            if name == self.engine_id or await self.redis.exists(self.keys.engine(name)):
                continue
            if consumer["pending"]:
                claimed += await self._claim_from(stream, name, min_idle_ms, count)
            else:
                await self.redis.xgroup_delconsumer(stream, ENGINE_GROUP, name)
        return claimed

    async def _claim_from(
        self, stream: str, consumer: str, min_idle_ms: int, count: int
    ) -> list[StreamEntry]:
        pending = await self.redis.xpending_range(
            stream, ENGINE_GROUP, min="-", max="+", count=count,
            consumername=consumer, idle=min_idle_ms,
        )  # fmt: skip
        entry_ids = [p["message_id"] for p in pending]
        if not entry_ids:
            return []
        answer = await self.redis.xclaim(
            stream, ENGINE_GROUP, self.engine_id, min_idle_ms, entry_ids
        )
        logger.warning("claimed %d un-ACKed request(s) of dead engine %s", len(answer), consumer)
        return [_entry(stream, entry_id, fields) for entry_id, fields in answer]

    async def _take_undelivered(self, engine_id: str, count: int) -> list[StreamEntry]:
        """Entries routed to dead `engine_id` that it never read."""
        stream = self.keys.routed_requests(engine_id)
        if not await self.redis.exists(stream):
            return []
        await self._create_group(stream)
        answer = await self.redis.xreadgroup(
            ENGINE_GROUP, self.engine_id, {stream: ">"}, count=count
        )
        taken = _entries(answer)
        if taken:
            logger.warning(
                "took %d request(s) routed to dead engine %s, never read", len(taken), engine_id
            )
        return taken

    async def read_new(self, count: int, block_ms: int | None) -> list[StreamEntry]:
        """New entries of the shared stream and of this engine's routed stream."""
        if count <= 0:
            return []
        # up to `count` per stream: never cut, each is delivered
        return _entries(await self._read_new_command(self.redis, count, block_ms))

    async def read_aborts(self) -> list[AbortRequest]:
        return self._aborts(await self._read_aborts_command(self.redis))

    async def read_arrivals(
        self, count: int, block_ms: int | None
    ) -> tuple[list[StreamEntry], list[AbortRequest]]:
        """`read_new` and then `read_aborts`. Without blocking, in one round trip: the
        scheduler reads between two steps, while the workers wait for the next plan."""
        if block_ms is not None or count <= 0:
            return await self.read_new(count, block_ms), await self.read_aborts()
        async with self.redis.pipeline(transaction=False) as pipe:
            self._read_new_command(pipe, count, None)
            self._read_aborts_command(pipe)
            new, aborts = await pipe.execute()
        return _entries(new), self._aborts(aborts)

    def _read_new_command(self, commands: Any, count: int, block_ms: int | None) -> Any:
        """XREADGROUP of the new entries, on the client (awaitable) or queued on a pipeline."""
        streams = dict.fromkeys(self.streams, ">")
        return commands.xreadgroup(
            ENGINE_GROUP, self.engine_id, streams, count=count, block=block_ms
        )

    def _read_aborts_command(self, commands: Any) -> Any:
        """XREAD of the aborts after the cursor, on the client or queued on a pipeline."""
        return commands.xread({self.keys.aborts: self._abort_cursor}, count=ABORT_READ_COUNT)

    def _aborts(self, answer: list | None) -> list[AbortRequest]:
        """The aborts of an XREAD of the abort stream; the cursor moves past them."""
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
        # one command (most steps: their outputs' XADD) is atomic alone; MULTI/EXEC is for more
        async with self.redis.pipeline(transaction=writes.num_commands > 1) as pipe:
            for gateway_id, deltas in writes.outputs.items():
                pipe.xadd(
                    self.keys.output(gateway_id),
                    {"m": encode(OutputBatch(self.engine_id, deltas))},
                    maxlen=OUTPUT_STREAM_MAXLEN,
                    approximate=True,
                )
            for stream, entry_ids in writes.acked.items():
                pipe.xack(stream, ENGINE_GROUP, *entry_ids)
                pipe.xdel(stream, *entry_ids)
            for request_id, fields in writes.statuses.items():
                key = self.keys.request(request_id)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self._status_ttl_s(fields))
            if writes.engine_fields is not None:
                self._queue_engine_fields(pipe, writes.engine_fields)
            assert len(pipe) == writes.num_commands, "num_commands must count what is queued"
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

    async def _create_group(self, stream: str) -> None:
        try:
            await self.redis.xgroup_create(stream, ENGINE_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def write_engine_status(self, status: EngineStatus) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            self._queue_engine_fields(pipe, to_fields(status))
            await pipe.execute()

    def _status_ttl_s(self, fields: dict[str, str]) -> int:
        """A finished request's record is kept `finished_request_ttl_s`, an open one's a day
        (it may wait in a queue that long)."""
        if fields.get("state") in FINAL_STATES:
            return self.finished_request_ttl_s
        return REQUEST_STATUS_TTL_S

    def _queue_engine_fields(self, pipe: aioredis.client.Pipeline, fields: dict[str, str]) -> None:
        key = self.keys.engine(self.engine_id)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, ENGINE_STATUS_TTL_S)
        pipe.sadd(self.keys.engines, self.engine_id)
