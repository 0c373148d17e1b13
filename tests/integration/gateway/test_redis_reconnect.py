"""After Redis restarts on the same port (as `pagedserve serve` restarts its private Redis),
every connection in the gateway's pool is stale; the first call on each must not fail a
request with `redis_unavailable` but retry on a fresh connection."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.redis_launcher import (
    RedisServer,
    find_redis_server,
    redis_server_command,
    wait_for_redis,
)
from pagedserve.services.gateway.engine_client import EngineClient

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
