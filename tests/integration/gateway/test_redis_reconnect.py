"""After Redis restarts on the same port (as `pagedserve serve` restarts its private Redis),
every connection in the gateway's pool is stale; the first call on each must not fail a
request with `redis_unavailable` but retry on a fresh connection. A connection whose transport
is closed under uvloop fails as a ConnectionError too, and the output reader outlives any
error."""

from __future__ import annotations

import asyncio
import logging
import subprocess

import pytest
import uvloop
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import (
    RedisServer,
    find_redis_server,
    redis_server_command,
    wait_for_redis,
)
from pagedserve.services.gateway import engine_client
from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.errors import ERROR_NO_LIVE_ENGINE
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import OutputBatch, TokenDelta, encode
from pagedserve.shared.redis_client import RedisTarget, async_redis

pytestmark = pytest.mark.integration


def restart_on_the_same_port(server: RedisServer) -> None:
    assert server._proc is not None
    server._proc.kill()
    server._proc.wait()
    argv = redis_server_command(find_redis_server(), server.port, server._dir.name)
    server._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_redis(server.url)


def test_calls_after_a_redis_restart_succeed_on_fresh_connections() -> None:
    async def scenario(server: RedisServer) -> list[object]:
        client = EngineClient(server.url, "reconnect", "gw-reconnect", max_pending_requests=8)
        try:
            # Fill the pool with several connections, all of which the restart makes stale.
            await asyncio.gather(*(client.engine_statuses() for _ in range(4)))
            restart_on_the_same_port(server)
            return await asyncio.gather(*(client.engine_statuses() for _ in range(4)))
        finally:
            await client.redis.aclose()

    with RedisServer(free_port()) as server:
        assert asyncio.run(scenario(server)) == [[], [], [], []]


def close_pooled_transports(client: EngineClient) -> int:
    """Close the transport under every idle pooled connection, as uvloop does when Redis
    closes a connection (killed, or restarted between a connect and its first command)."""
    connections = list(client.redis.connection_pool._available_connections)
    for connection in connections:
        connection._writer.transport.close()
    return len(connections)


def test_a_closed_transport_under_uvloop_is_retried_not_a_runtime_error(redis_url: str) -> None:
    """uvloop (the gateway's loop) raises RuntimeError for a write to a closed transport; the
    gateway's clients see a ConnectionError instead, which their retry and error handling
    know (redis-py alone let the RuntimeError through: CI saw it kill the output reader)."""

    async def scenario() -> tuple[int, list[object], type]:
        client = EngineClient(redis_url, "closed", "gw-closed", max_pending_requests=8)
        no_retry = async_redis(RedisTarget(redis_url), retry=Retry(NoBackoff(), 0))
        try:
            await asyncio.gather(*(client.engine_statuses() for _ in range(4)))
            num_closed = close_pooled_transports(client)
            answers = await asyncio.gather(*(client.engine_statuses() for _ in range(4)))
            await no_retry.ping()
            no_retry.connection_pool._available_connections[0]._writer.transport.close()
            try:
                await no_retry.ping()
                raised: type = type(None)
            except Exception as exc:  # which type it is, is what the test checks
                raised = type(exc)
            return num_closed, answers, raised
        finally:
            await client.redis.aclose()
            await no_retry.aclose()

    num_closed, answers, raised = uvloop.run(scenario())
    assert num_closed >= 1
    assert answers == [[], [], [], []]
    assert issubclass(raised, RedisConnectionError), raised


def test_the_output_reader_lives_through_an_error_that_is_not_a_redis_error(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every open stream of a gateway waits on its output reader: an unexpected exception is
    logged with its traceback and the reader reads on."""

    async def scenario() -> TokenDelta:
        client = EngineClient(redis_url, "reader", "gw-reader", max_pending_requests=8)
        read = client._read_after_deleting
        failures = ["not yet"]

        async def fails_once(*args: object) -> list | None:
            if failures:
                failures.pop()
                raise RuntimeError("a library's surprise")
            return await read(*args)  # type: ignore[arg-type]

        client._read_after_deleting = fails_once  # type: ignore[method-assign]
        queue = client.open_stream("req-1")
        await client.start()
        try:
            batch = OutputBatch("engine-1", [TokenDelta("req-1", [7, 8], num_output_tokens=2)])
            await client.redis.xadd(client.keys.output("gw-reader"), {"m": encode(batch)})
            return await asyncio.wait_for(queue.get(), 30)
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING):
        delta = asyncio.run(scenario())
    assert delta.token_ids == [7, 8]
    failure = [r for r in caplog.records if "output stream read failed" in r.getMessage()]
    assert failure and "a library's surprise" in failure[0].getMessage()
    assert failure[0].exc_info is not None  # not a RedisError: logged with its traceback
    assert not [r for r in caplog.records if "died" in r.getMessage()]


def test_the_heartbeat_lives_through_an_error_that_is_not_a_redis_error(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without its heartbeat a gateway counts as gone and the engines abort its requests."""

    async def scenario() -> bool:
        client = EngineClient(redis_url, "beat", "gw-beat", max_pending_requests=8)
        key = client.keys.gateway
        failures = ["not yet"]

        class FailsOnce(RedisKeys):  # the heartbeat's first call inside its try
            def gateway(self, gateway_id: str) -> str:
                if failures:
                    failures.pop()
                    raise RuntimeError("a library's surprise")
                return super().gateway(gateway_id)

        client.keys = FailsOnce(client.keys.namespace)
        await client.start()
        try:
            for _ in range(300):  # the next beat comes 2 s after the failed one
                if await client.redis.exists(key("gw-beat")):
                    return True
                await asyncio.sleep(0.1)
            return False
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING):
        beat = asyncio.run(scenario())
    assert beat
    failure = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert failure and failure[0].exc_info is not None


def test_the_engine_watch_lives_through_an_error_that_is_not_a_redis_error(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the engine watch, open streams wait forever on an engine that is gone: after a
    read it could not make sense of, it goes on and still ends them with `no_live_engine`."""
    monkeypatch.setattr(engine_client, "ENGINE_WATCH_INTERVAL_S", 0.2)

    async def scenario() -> TokenDelta:
        client = EngineClient(
            redis_url, "watch", "gw-watch", max_pending_requests=8, engine_loss_timeout_s=0.5
        )
        read = client.engine_statuses
        failures = ["not yet"]

        async def fails_once() -> list:
            if failures:
                failures.pop()
                raise ValueError("an engine status record it cannot parse")
            return await read()  # no engine registered: none is live

        client.engine_statuses = fails_once  # type: ignore[method-assign]
        queue = client.open_stream("req-1")
        await client.start()
        try:
            return await asyncio.wait_for(queue.get(), 30)
        finally:
            await client.close()

    delta = asyncio.run(scenario())
    assert (delta.finish_reason, delta.error_code) == ("error", ERROR_NO_LIVE_ENGINE)
