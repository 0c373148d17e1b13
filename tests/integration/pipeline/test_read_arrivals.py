"""The scheduler's read between two steps, against a real Redis: new requests and aborts in
one round trip (`RedisIO.read_arrivals`), each delivered once, the abort cursor moving past
what was read."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import AbortRequest, GenerateRequest, SamplingParams, encode

pytestmark = pytest.mark.integration

KEYS = RedisKeys("arrivals")


def request(i: int) -> GenerateRequest:
    return GenerateRequest(f"r-{i}", [1, 2, 3], SamplingParams(max_tokens=2), "gw")


async def fresh_io(client: aioredis.Redis, engine_id: str) -> RedisIO:
    """An engine's RedisIO over empty request and abort streams."""
    await client.delete(KEYS.requests, KEYS.aborts)
    io = RedisIO(client, KEYS, engine_id)
    await io.setup()
    return io


async def queue(client: aioredis.Redis, requests: int, aborts: list[str]) -> None:
    for i in range(requests):
        await client.xadd(KEYS.requests, {"m": encode(request(i))})
    for request_id in aborts:
        await client.xadd(KEYS.aborts, {"m": encode(AbortRequest([request_id], "abort"))})


def test_requests_and_aborts_are_read_together_and_once(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        io = await fresh_io(client, "engine-a")
        await queue(client, 3, ["r-0", "r-1"])

        entries, aborts = await io.read_arrivals(count=10, block_ms=None)
        assert [e.request.request_id for e in entries] == ["r-0", "r-1", "r-2"]
        assert [a.request_ids for a in aborts] == [["r-0"], ["r-1"]]
        assert await io.read_arrivals(count=10, block_ms=None) == ([], [])

        await queue(client, 0, ["r-2"])  # only what came after the cursor
        entries, aborts = await io.read_arrivals(count=10, block_ms=None)
        assert entries == [] and [a.request_ids for a in aborts] == [["r-2"]]
        await client.aclose()

    asyncio.run(scenario())


def test_no_room_reads_aborts_only_and_leaves_the_requests(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        io = await fresh_io(client, "engine-b")
        await queue(client, 2, ["r-9"])

        entries, aborts = await io.read_arrivals(count=0, block_ms=None)
        assert entries == [] and [a.request_ids for a in aborts] == [["r-9"]]
        entries, aborts = await io.read_arrivals(count=1, block_ms=None)  # up to 1 a stream
        assert [e.request.request_id for e in entries] == ["r-0"] and aborts == []
        entries, _ = await io.read_arrivals(count=5, block_ms=20)  # the blocking form
        assert [e.request.request_id for e in entries] == ["r-1"]
        assert await io.read_arrivals(count=5, block_ms=20) == ([], [])
        await client.aclose()

    asyncio.run(scenario())
