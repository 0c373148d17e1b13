"""A scripted engine that, like the real scheduler, outlives a Redis outage: it publishes its
status record every `STATUS_INTERVAL_S` (backing off after a failure), retries what it writes,
recreates its consumer group after a Redis restart, and ignores a request it already holds
when a gateway queues it again."""

from __future__ import annotations

import contextlib
import threading
import time

import redis

from pagedserve.shared.keys import ENGINE_GROUP
from pagedserve.shared.protocol import GenerateRequest, ProtocolError, TokenDelta, decode
from pagedserve.shared.status import ENGINE_STATUS_TTL_S, EngineStatus, to_fields
from tests.integration.gateway.scripted_engine import ScriptedEngine

STATUS_INTERVAL_S = 1.0
RETRY_BACKOFF_S = 2.0  # after a failed write, as the scheduler's outbox backs off


class SteadyEngine(ScriptedEngine):
    engine_id = "steady"

    def start(self) -> SteadyEngine:
        self.redis.close()
        self.redis = redis.Redis.from_url(self.redis_url, socket_timeout=1)
        self._holding: set[str] = set()
        super().start()
        thread = threading.Thread(target=self._publish_status, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _publish_status(self) -> None:
        while not self._stop.is_set():
            status = EngineStatus(self.engine_id, time=time.time(), workers_alive=True)
            try:
                with self.redis.pipeline(transaction=False) as pipe:
                    pipe.sadd(self.keys.engines, self.engine_id)
                    pipe.hset(self.keys.engine(self.engine_id), mapping=to_fields(status))
                    pipe.expire(self.keys.engine(self.engine_id), ENGINE_STATUS_TTL_S)
                    pipe.execute()
            except redis.RedisError:
                self._stop.wait(RETRY_BACKOFF_S)
            self._stop.wait(STATUS_INTERVAL_S)

    def _serve_requests(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self.redis.xreadgroup(
                    ENGINE_GROUP, "steady", {self.keys.requests: ">"}, count=16, block=100
                )
            except redis.ResponseError:  # NOGROUP: Redis restarted empty
                with contextlib.suppress(redis.RedisError):
                    self.redis.xgroup_create(self.keys.requests, ENGINE_GROUP, "0", mkstream=True)
                continue
            except redis.RedisError:
                self._stop.wait(0.2)
                continue
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    self._take(entry_id, fields)

    def _take(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            request = decode(fields[b"m"])
        except (KeyError, ProtocolError):
            return
        if not isinstance(request, GenerateRequest) or request.request_id in self._holding:
            return
        self._holding.add(request.request_id)
        self.received.append(request)
        thread = threading.Thread(target=self._answer, args=(entry_id, request), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read_aborts(self) -> None:
        while not self._stop.is_set():
            try:
                super()._read_aborts()
            except redis.RedisError:
                self._stop.wait(0.2)

    def _send(self, gateway_id: str, delta: TokenDelta) -> None:
        while not self._stop.is_set():
            try:
                super()._send(gateway_id, delta)
                return
            except redis.RedisError:
                self._stop.wait(0.2)

    def _finish(self, entry_id: bytes) -> None:
        with contextlib.suppress(redis.RedisError):
            super()._finish(entry_id)
