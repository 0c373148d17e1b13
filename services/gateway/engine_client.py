"""The gateway's side of Redis: queue requests, send aborts, receive token deltas, heartbeat.

One reader task per gateway blocks on this gateway's output stream, decodes `OutputBatch`es
and hands each `TokenDelta` to its request's asyncio.Queue, deleting what it consumed so the
stream stays short. Deltas for requests nobody waits for any more (aborted, disconnected) are
dropped. Redis being down is never fatal: calls raise a 503 `APIError`, the background tasks
retry with backoff.

No request waits forever for an engine that is gone: a watch task reads the engines' status
records, and once none has been live for `engine_loss_timeout_s` of the time Redis answered it
ends every open stream with a `no_live_engine` error (503); the gateway's own blindness (Redis
down or stalled) is not engine death (`engine_watch.py`). A scheduler restart or a replica's
claim within that bound is invisible to the client (see `replay_guard.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from pagedserve.services.gateway.engine_watch import EngineLossClock
from pagedserve.services.gateway.errors import ERROR_NO_LIVE_ENGINE, APIError, unavailable
from pagedserve.services.gateway.router import Router
from pagedserve.services.gateway.status_view import EngineStatusView
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import (
    AbortRequest,
    GenerateRequest,
    OutputBatch,
    ProtocolError,
    TokenDelta,
    decode,
    encode,
)
from pagedserve.shared.redis_client import RedisTarget, async_redis_blocking_pool
from pagedserve.shared.status import (
    GATEWAY_HEARTBEAT_TTL_S,
    REQUEST_STATUS_TTL_S,
    EngineStatus,
    RequestStatus,
    from_fields,
    is_engine_live,
    to_fields,
)
from pagedserve.shared.tasks import cancel_and_wait, start_background

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 2.0
READ_BLOCK_MS = 1000
READ_COUNT = 256
ABORTS_MAXLEN = 100_000  # the aborts stream is read by every engine, never consumed: cap it
MAX_BACKOFF_S = 2.0
ENGINE_WATCH_INTERVAL_S = 2.0
REDIS_MAX_CONNECTIONS = 64  # per gateway; calls beyond wait for a free one
REDIS_POOL_WAIT_S = 20.0  # longest wait for a free connection before a 503
REDIS_HEALTH_CHECK_S = 1.0


class EngineClient:
    """Redis in/out for one gateway replica."""

    def __init__(
        self,
        redis: RedisTarget | str,
        namespace: str,
        gateway_id: str,
        max_pending_requests: int,
        engine_loss_timeout_s: float = 30.0,
        routing: str = "cache",
    ) -> None:
        self.keys = RedisKeys(namespace)
        self.engine_loss_timeout_s = engine_loss_timeout_s
        self.gateway_id = gateway_id
        self.max_pending_requests = max_pending_requests
        # A bounded pool that makes callers wait for a free connection: under a burst of
        # requests the default pool fails calls with "Too many connections" instead.
        self.redis = async_redis_blocking_pool(
            redis if isinstance(redis, RedisTarget) else RedisTarget(redis),
            REDIS_MAX_CONNECTIONS,
            REDIS_POOL_WAIT_S,
            socket_connect_timeout=2,
            socket_timeout=5,
            # After a Redis restart (or a sentinel failover) every pooled connection is dead and
            # the first call on each would fail: a connection idle a while is PINGed first, and
            # a call that finds its connection closed is tried once more on a fresh one (an
            # engine drops a request queued twice; through sentinels, the fresh one is to the
            # primary they name now).
            health_check_interval=REDIS_HEALTH_CHECK_S,
            # Not on a timeout: a stalled Redis would hold each call twice as long.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            retry_on_error=[RedisConnectionError],
        )
        self._streams: dict[str, asyncio.Queue[TokenDelta]] = {}
        self._engine_of: dict[str, str] = {}  # request id -> the engine of its last output
        self._submitted: dict[
            str, GenerateRequest
        ] = {}  # open ones, to re-queue if Redis lost them
        self._tasks: list[asyncio.Task[None]] = []
        self.num_dropped_deltas = 0
        self.status_view = EngineStatusView(self.engine_statuses, self.process_restarts)
        self.router = Router(self.redis, self.keys, self.status_view, routing)

    async def start(self) -> None:
        self._tasks = [
            start_background(self._read_outputs(), "gateway-output-reader"),
            start_background(self._heartbeat(), "gateway-heartbeat"),
            start_background(self._watch_engines(), "gateway-engine-watch"),
            start_background(self._watch_redis_restarts(), "gateway-redis-watch"),
            start_background(self.status_view.run(), "gateway-status-view"),
        ]

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        with contextlib.suppress(Exception):
            await self.redis.delete(self.keys.gateway(self.gateway_id))
            await self.redis.srem(self.keys.gateways, self.gateway_id)
        await self.redis.aclose()

    # -- per request ---------------------------------------------------------------------------

    def open_stream(
        self, request_id: str, queue: asyncio.Queue[TokenDelta] | None = None
    ) -> asyncio.Queue[TokenDelta]:
        """Register before submitting, so that no delta arrives before its queue exists. The
        choices of one HTTP request may share a queue."""
        queue = queue if queue is not None else asyncio.Queue()
        self._streams[request_id] = queue
        return queue

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._engine_of.pop(request_id, None)
        self._submitted.pop(request_id, None)

    def engine_of(self, request_id: str) -> str:
        """The engine whose outputs a request's stream last received ("" before any)."""
        return self._engine_of.get(request_id, "")

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    def finish_open_streams(
        self, finish_reason: str, error: str | None = None, error_code: str | None = None
    ) -> list[str]:
        """End every open stream here with a final delta, without asking the engines (used
        when shutting down); returns the ids of the requests so ended."""
        request_ids = list(self._streams)
        for request_id in request_ids:
            delta = TokenDelta(
                request_id, [], finish_reason=finish_reason, error=error, error_code=error_code
            )
            self._streams[request_id].put_nowait(delta)
        return request_ids

    async def submit(self, requests: list[GenerateRequest]) -> None:
        """Queue requests for the engines, each on the stream its route names (`router.py`);
        503 when the queues are full or Redis is down."""
        try:
            async with self.router.turn():
                plan = await self.router.plan(requests)
                if plan.queue_depth + len(requests) > self.max_pending_requests:
                    raise unavailable(
                        f"the request queue is full ({plan.queue_depth} pending, limit "
                        f"{self.max_pending_requests}); retry later",
                        code="queue_full",
                    )
                async with self.redis.pipeline(transaction=False) as pipe:
                    for request, stream in zip(requests, plan.streams, strict=True):
                        self._queue_commands(pipe, request, stream)
                    await pipe.execute()
                self.router.commit(plan)
        except RedisError as exc:
            raise _redis_down(exc) from exc
        for request in requests:
            if request.request_id in self._streams:
                self._submitted[request.request_id] = request

    def _queue_commands(
        self, pipe: aioredis.client.Pipeline, request: GenerateRequest, stream: str
    ) -> None:
        status = RequestStatus(
            request_id=request.request_id,
            state="queued",
            gateway_id=self.gateway_id,
            num_prompt_tokens=len(request.prompt_token_ids),
            queued_at=request.arrival_time,
        )
        key = self.keys.request(request.request_id)
        pipe.xadd(stream, {"m": encode(request)})
        pipe.hset(key, mapping=to_fields(status))
        pipe.expire(key, REQUEST_STATUS_TTL_S)

    async def abort(self, request_ids: list[str], reason: str = "abort") -> None:
        """Tell every engine to drop these requests. Best effort: logged, never raised."""
        for request_id in request_ids:
            self.close_stream(request_id)
        try:
            await self.redis.xadd(
                self.keys.aborts,
                {"m": encode(AbortRequest(list(request_ids), reason))},
                maxlen=ABORTS_MAXLEN,
                approximate=True,
            )
        except RedisError as exc:  # the engine aborts them anyway once our heartbeat expires
            logger.warning("could not send abort for %s: %s", request_ids, exc)

    async def scheduled_at(self, request_id: str) -> float:
        """When an engine first scheduled the request (0.0 if unknown)."""
        with contextlib.suppress(RedisError, ValueError):
            value = await self.redis.hget(self.keys.request(request_id), "scheduled_at")
            return float(value or 0.0)
        return 0.0

    # -- engines -------------------------------------------------------------------------------

    async def engine_statuses(self) -> list[EngineStatus]:
        """Every registered engine's latest status record (raises RedisError)."""
        engine_ids = sorted(m.decode() for m in await self.redis.smembers(self.keys.engines))
        async with self.redis.pipeline(transaction=False) as pipe:
            for engine_id in engine_ids:
                pipe.hgetall(self.keys.engine(engine_id))
            records = await pipe.execute()
        return [from_fields(EngineStatus, r) for r in records if r]

    async def process_restarts(self) -> dict[str, int]:
        """How often `pagedserve serve` restarted each of its processes (raises RedisError)."""
        counts = await self.redis.hgetall(self.keys.process_restarts)
        return {name.decode(): int(value) for name, value in counts.items()}

    @staticmethod
    def is_live(status: EngineStatus, now: float | None = None) -> bool:
        return is_engine_live(status, time.time() if now is None else now)

    # -- background tasks ----------------------------------------------------------------------

    async def _read_outputs(self) -> None:
        stream = self.keys.output(self.gateway_id)
        last_id = "0-0"  # entries left from a previous life of this id are read and dropped
        consumed: list[bytes] = []  # read and dispatched, not yet deleted
        backoff = 0.1
        while True:
            try:
                answer = await self._read_after_deleting(stream, last_id, consumed)
                consumed = []
                backoff = 0.1
            except Exception as exc:  # every open stream waits on this loop: it must not die
                _log_failure(exc, "output stream read failed (%s); retrying in %.1fs", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    self._dispatch(fields.get(b"m"))
                    last_id = entry_id
                    consumed.append(entry_id)

    async def _read_after_deleting(
        self, stream: str, last_id: str | bytes, consumed: list[bytes]
    ) -> list | None:
        """The entries after `last_id` (blocking up to READ_BLOCK_MS), with those already
        read deleted in the same round trip: one per step's outputs, not two."""
        if not consumed:
            return await self.redis.xread({stream: last_id}, count=READ_COUNT, block=READ_BLOCK_MS)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xdel(stream, *consumed)
            pipe.xread({stream: last_id}, count=READ_COUNT, block=READ_BLOCK_MS)
            _, answer = await pipe.execute()
        return answer

    def _dispatch(self, payload: bytes | None) -> None:
        try:
            batch = decode(payload) if payload is not None else None
        except ProtocolError as exc:
            logger.error("undecodable output entry dropped: %s", exc)
            return
        if not isinstance(batch, OutputBatch):
            logger.error("output entry is %s, not an OutputBatch", type(batch).__name__)
            return
        for delta in batch.deltas:
            queue = self._streams.get(delta.request_id)
            if queue is None:
                self.num_dropped_deltas += 1
                continue
            self._engine_of[delta.request_id] = batch.engine_id
            queue.put_nowait(delta)

    async def _watch_engines(self) -> None:
        clock = EngineLossClock()  # counts only while Redis answers: blindness is not death
        while True:
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
            started_at = time.monotonic()
            try:
                statuses = await self.engine_statuses()
                any_live: bool | None = any(self.is_live(s) for s in statuses)
            except RedisError:  # the output reader and submit() report Redis trouble
                any_live = None
            except Exception:  # a record it cannot read: blind this round, never dead
                logger.exception("engine status read failed")
                any_live = None
            clock.record_read(started_at, time.monotonic(), any_live)
            if self._streams and clock.num_dead_s > self.engine_loss_timeout_s:
                message = (
                    f"no engine has been live for {clock.num_dead_s:.0f}s while Redis answered "
                    f"(limit {self.engine_loss_timeout_s:g}s); the request was not finished"
                )
                ended = self.finish_open_streams("error", message, ERROR_NO_LIVE_ENGINE)
                logger.error("ended %d open request(s): %s", len(ended), message)

    async def _watch_redis_restarts(self) -> None:
        """A Redis restarted without persistence has lost the queued requests. Its run id
        changes; then every open request whose status record is gone (no engine has written
        it since) is queued again. An engine that already holds one drops the duplicate."""
        run_id: str | None = None
        while True:
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
            try:
                current = str((await self.redis.info("server"))["run_id"])
                if run_id is not None and current != run_id:
                    await self._requeue_lost_requests()
                run_id = current
            except RedisError as exc:
                logger.debug("Redis restart check failed: %s", exc)

    async def _requeue_lost_requests(self) -> None:
        requests = list(self._submitted.values())
        async with self.redis.pipeline(transaction=False) as pipe:
            for request in requests:
                pipe.exists(self.keys.request(request.request_id))
            found = await pipe.execute()
        lost = [r for r, exists in zip(requests, found, strict=True) if not exists]
        logger.warning(
            "Redis restarted (new run id): %d of %d open request(s) lost, queued again",
            len(lost),
            len(requests),
        )
        if lost:
            async with self.redis.pipeline(transaction=False) as pipe:
                for request in lost:  # to any engine: the routes' summaries are gone too
                    self._queue_commands(pipe, request, self.keys.requests)
                await pipe.execute()

    async def _heartbeat(self) -> None:
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.set(
                        self.keys.gateway(self.gateway_id), time.time(), ex=GATEWAY_HEARTBEAT_TTL_S
                    )
                    pipe.sadd(self.keys.gateways, self.gateway_id)
                    await pipe.execute()
            except Exception as exc:  # without it the engines abort this gateway's requests
                _log_failure(exc, "heartbeat failed: %s")
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)


def _log_failure(exc: Exception, message: str, *args: object) -> None:
    """A RedisError is an outage, a warning; any other error a bug or a library's surprise,
    logged with its traceback. `message` takes `exc` first, then `args`."""
    log = logger.warning if isinstance(exc, RedisError) else logger.exception
    log(message, exc, *args)


def _redis_down(exc: Exception) -> APIError:
    return unavailable(f"the request queue (Redis) is unreachable: {exc}", code="redis_unavailable")
