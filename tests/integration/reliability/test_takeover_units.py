"""The takeover and integrity pieces in-process, in about a second each: `claim_abandoned`
against a real Redis (dead vs live consumers, idle bound, clean-up), and the engine loop's
idle integrity check (the status reporter's) flagging a broken scheduler without stopping."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis.asyncio as aioredis

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.status_reporter import StatusReporter
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, encode
from tests.unit.scheduler.helpers import make_scheduler

pytestmark = pytest.mark.integration

KEYS = RedisKeys("takeover")


def request(i: int) -> GenerateRequest:
    return GenerateRequest(f"r-{i}", [1, 2, 3], SamplingParams(max_tokens=2), "gw")


async def deliver(client: aioredis.Redis, consumer: str, count: int) -> list[str]:
    """Queue `count` requests and have `consumer` read them (pending, un-ACKed)."""
    for i in range(count):
        await client.xadd(KEYS.requests, {"m": encode(request(i))})
    answer = await client.xreadgroup(ENGINE_GROUP, consumer, {KEYS.requests: ">"}, count=count)
    return [entry_id.decode() for entry_id, _ in answer[0][1]]


async def consumers(client: aioredis.Redis) -> dict[str, int]:
    infos = await client.xinfo_consumers(KEYS.requests, ENGINE_GROUP)
    return {info["name"].decode(): info["pending"] for info in infos}


def test_only_dead_engines_entries_are_claimed_once_idle(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        live = RedisIO(client, KEYS, "engine-live")
        await live.setup()
        dead_ids = await deliver(client, "engine-dead", 3)
        busy_ids = await deliver(client, "engine-busy", 2)
        await client.set(KEYS.engine("engine-busy"), "1")  # its status is fresh: alive
        await client.set(KEYS.engine("engine-live"), "1")

        assert await live.claim_abandoned(min_idle_ms=60_000) == []  # not idle long enough
        await asyncio.sleep(0.05)
        claimed = await live.claim_abandoned(min_idle_ms=10)
        assert sorted(e.entry_id for e in claimed) == sorted(dead_ids)
        assert [e.request.request_id for e in claimed] == ["r-0", "r-1", "r-2"]
        pending = await consumers(client)
        assert pending["engine-live"] == 3 and pending["engine-busy"] == len(busy_ids)
        assert pending["engine-dead"] == 0

        # A second engine racing for the same entries gets nothing; the emptied dead
        # consumer is removed from the group.
        other = RedisIO(client, KEYS, "engine-other")
        await client.set(KEYS.engine("engine-other"), "1")
        assert await other.claim_abandoned(min_idle_ms=10_000) == []
        assert "engine-dead" not in await consumers(client)
        await client.aclose()

    asyncio.run(scenario())


def test_a_dead_engines_routed_requests_are_claimed_delivered_or_not(redis_url: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(redis_url)
        dead = RedisIO(client, KEYS, "engine-dead")
        await dead.setup()
        await client.sadd(KEYS.engines, "engine-dead", "engine-live")
        routed = KEYS.routed_requests("engine-dead")
        for i in range(4):
            await client.xadd(routed, {"m": encode(request(i))})
        delivered = await dead.read_new(count=2, block_ms=None)  # 2 read, 2 never read
        assert [e.stream for e in delivered] == [routed, routed]
        live = RedisIO(client, KEYS, "engine-live")
        await live.setup()
        await client.set(KEYS.engine("engine-live"), "1")
        await client.set(KEYS.engine("engine-dead"), "1")
        assert await live.claim_abandoned(min_idle_ms=10) == []  # alive: nothing taken
        await client.delete(KEYS.engine("engine-dead"))  # its status expired
        await asyncio.sleep(0.05)
        claimed = await live.claim_abandoned(min_idle_ms=10)
        assert sorted(e.request.request_id for e in claimed) == ["r-0", "r-1", "r-2", "r-3"]
        assert {e.stream for e in claimed} == {routed}
        other = RedisIO(client, KEYS, "engine-other")
        assert await other.claim_abandoned(min_idle_ms=10) == []  # each entry taken once
        await client.aclose()

    asyncio.run(scenario())


def make_status_reporter() -> tuple[StatusReporter, Scheduler, WorkerLink]:
    """A status reporter over a real Scheduler; Redis and the workers are never contacted."""
    scheduler = make_scheduler()
    io = RedisIO(aioredis.Redis.from_url("redis://127.0.0.1:1/0"), RedisKeys("x"), "engine-x")
    link = WorkerLink("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", 1, 16)
    ledger = Ledger(scheduler, Outbox(io, RedisBackoff()), "engine-x")
    return StatusReporter(io, link, scheduler, ledger, asyncio.Event()), scheduler, link


def test_a_failed_integrity_check_is_logged_and_flagged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reporter, scheduler, link = make_status_reporter()
    reporter.check_integrity()
    status = reporter.status(workers_alive=True)
    assert status.integrity_ok and status.integrity_checked_at > 0

    scheduler.kv.pool.blocks[0].ref_count = 5  # a leaked reference: an invariant broken
    before = time.time()
    with caplog.at_level(logging.ERROR):
        reporter.check_integrity()
        reporter.check_integrity()  # logged once, not at every check
    status = reporter.status(workers_alive=True)
    assert not status.integrity_ok and status.integrity_checked_at >= before
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert caplog.records[0].message.startswith("integrity check failed")

    scheduler.kv.pool.blocks[0].ref_count = 0  # repaired: the flag clears
    reporter.check_integrity()
    assert reporter.status(workers_alive=True).integrity_ok
    link._context.term()
