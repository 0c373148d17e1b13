"""The outbox against a real Redis that restarts without persistence: deltas Redis accepted
but lost before the gateway read them are written again, and the gateway's replay guard turns
the resend into exactly the missing tokens (the "output tokens 8..8 never arrived" window)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from pagedserve.services.gateway.replay_guard import ReplayGuard
from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import TokenDelta, decode
from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.integration

KEYS = RedisKeys("outbox")
GATEWAY = "gw"


def delta(first: int, count: int) -> TokenDelta:
    """Output tokens first..first+count-1 of request r (token id = position + 100)."""
    return TokenDelta(
        request_id="r",
        token_ids=[100 + p for p in range(first, first + count)],
        num_prompt_tokens=3,
        num_output_tokens=first + count,
    )


class GatewayReader:
    """Reads the output stream as a gateway does: in order, deleting what it read, each delta
    through a ReplayGuard; `shown` is what the client has seen."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.guard = ReplayGuard()
        self.shown: list[int] = []

    async def read(self) -> None:
        answer = await self.client.xread({KEYS.output(GATEWAY): "0-0"})
        for _, entries in answer or []:
            for entry_id, fields in entries:
                for d in decode(fields[b"m"]).deltas:
                    self.shown += self.guard.admit(d).token_ids
                await self.client.xdel(KEYS.output(GATEWAY), entry_id)


async def flush_when_allowed(outbox: Outbox, backoff: RedisBackoff) -> None:
    await asyncio.sleep(backoff.remaining_s)
    await outbox.flush()


async def restart_scenario(server: RedisServer) -> GatewayReader:
    client = aioredis.Redis.from_url(server.url)
    backoff = RedisBackoff()
    outbox = Outbox(RedisIO(client, KEYS, "e1"), backoff)
    reader = GatewayReader(client)
    outbox.send(GATEWAY, delta(0, 8))
    await outbox.flush()
    await reader.read()  # the client has seen tokens 0..7
    outbox.send(GATEWAY, delta(8, 1))
    await outbox.flush()  # accepted by Redis, not read yet...
    server.stop()  # ...and lost with it
    outbox.send(GATEWAY, delta(9, 1))
    await outbox.flush()  # fails: kept, backed off
    assert backoff.num_failures == 1 and outbox
    server.start()  # same port, empty
    await flush_when_allowed(outbox, backoff)
    await reader.read()
    await client.aclose()
    return reader


def test_deltas_a_restarted_redis_lost_are_written_again() -> None:
    server = RedisServer()
    server.start()
    try:
        reader = asyncio.run(restart_scenario(server))
    finally:
        server.stop()
    assert reader.shown == [100 + p for p in range(10)]  # 8 is back, nothing twice
    assert reader.guard.num_replayed_tokens == 8  # the resent 0..7, dropped by the gateway


def test_a_resend_after_a_failure_without_data_loss_shows_nothing_twice(redis_url: str) -> None:
    async def scenario() -> GatewayReader:
        client = aioredis.Redis.from_url(redis_url)
        backoff = RedisBackoff()
        outbox = Outbox(RedisIO(client, KEYS, "e1"), backoff)
        reader = GatewayReader(client)
        for first in range(0, 6, 2):
            outbox.send(GATEWAY, delta(first, 2))
            await outbox.flush()
        await reader.read()
        await backoff.failed("read", RedisConnectionError("a stall"), wait=False)
        outbox.send(GATEWAY, delta(6, 2))
        await flush_when_allowed(outbox, backoff)
        await reader.read()
        outbox.send(GATEWAY, delta(8, 1))  # back to normal: no resend
        await outbox.flush()
        await reader.read()
        await client.aclose()
        return reader

    reader = asyncio.run(scenario())
    assert reader.shown == [100 + p for p in range(9)]
    assert reader.guard.num_replayed_tokens == 6


def test_deltas_older_than_the_resend_window_are_forgotten(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[int]:
        client = aioredis.Redis.from_url(redis_url)
        backoff = RedisBackoff()
        outbox = Outbox(RedisIO(client, KEYS, "e1"), backoff)
        outbox.send(GATEWAY, delta(0, 2))
        await outbox.flush()
        now = time.monotonic()
        monkeypatch.setattr(time, "monotonic", lambda: now + 60)  # a minute later
        outbox.send(GATEWAY, delta(2, 1))
        await outbox.flush()  # prunes the first write
        monkeypatch.undo()
        await backoff.failed("read", RedisConnectionError("x"), wait=False)
        await flush_when_allowed(outbox, backoff)  # resends only what is in the window
        answer = await client.xread({KEYS.output(GATEWAY): "0-0"})
        await client.aclose()
        return [t for _, es in answer for _, f in es for d in decode(f[b"m"]).deltas
                for t in d.token_ids]  # fmt: skip

    assert asyncio.run(scenario()) == [100, 101, 102, 102]
