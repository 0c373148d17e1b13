"""The gateway's router against engines' published cache summaries, on a real Redis: the
publisher runs over a real scheduler's KV cache manager, the router hashes prompts with the
same shared function, and the choice follows the cache, then the load."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from pagedserve.services.gateway.route_choice import REASON_CACHE, REASON_LOAD, REASON_SHARED
from pagedserve.services.gateway.router import Router
from pagedserve.services.gateway.status_view import StatusSnapshot
from pagedserve.services.scheduler.cache_publisher import CachePublisher
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.cache_summary import CACHE_SUMMARY_TTL_S
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import EngineStatus
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step

pytestmark = pytest.mark.integration

KEYS = RedisKeys("routing")
BLOCK_SIZE = 4
TENANT_A = [11 + i for i in range(16)]  # 4 full blocks
TENANT_B = [500 + i for i in range(16)]


class FixedStatusView:
    """Stands in for the gateway's status view: the records given, always fresh."""

    def __init__(self, **loads: int) -> None:
        self.loads = loads

    async def current(self) -> StatusSnapshot:
        return StatusSnapshot([
            EngineStatus(engine_id, time.time(), True, num_running=load, num_free_blocks=64,
                         block_size=BLOCK_SIZE)
            for engine_id, load in self.loads.items()
        ])  # fmt: skip


def serve(scheduler: Scheduler, prompt: list[int], request_id: str) -> None:
    worker = FakeWorker(num_blocks=scheduler.num_blocks, block_size=BLOCK_SIZE)
    scheduler.add_request(make_request(request_id, prompt, max_tokens=1))
    while scheduler.has_unfinished_requests():
        run_step(scheduler, worker)


def route(
    client: aioredis.Redis,
    view: FixedStatusView,
    policy: str,
    prompt: list[int],
    cache_salt: str | None = None,
):
    async def plan():
        router = Router(client, KEYS, view, policy)  # type: ignore[arg-type]
        request = dataclasses.replace(make_request("q", prompt), cache_salt=cache_salt)
        return await router.plan([request])

    return asyncio.get_event_loop().run_until_complete(plan())


@pytest.fixture
def client(redis_url: str):
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    redis = aioredis.Redis.from_url(redis_url)
    yield redis
    loop.run_until_complete(redis.aclose())
    loop.close()


def test_requests_follow_the_engine_that_holds_their_prefix(client: aioredis.Redis) -> None:
    scheduler = make_scheduler(num_blocks=8, block_size=BLOCK_SIZE)
    serve(scheduler, TENANT_A, "warm")
    publisher = CachePublisher(client, KEYS, "e1", scheduler.kv)
    loop = asyncio.get_event_loop()
    loop.run_until_complete(publisher.publish_once())
    assert publisher.num_published == 4  # the 16 prompt tokens: 4 full blocks cached

    view = FixedStatusView(e1=3, e2=0)  # e1 is busier, but holds tenant A
    plan = route(client, view, "cache", [*TENANT_A, 99, 98])
    assert plan.streams == [KEYS.routed_requests("e1")]
    assert plan.choices[0].reason == REASON_CACHE and plan.choices[0].hit_tokens == 16
    salted = route(client, view, "cache", [*TENANT_A, 99, 98], cache_salt="tenant-x")
    assert salted.choices[0].reason == REASON_LOAD  # another salt: another cache namespace
    other = route(client, view, "cache", [*TENANT_B, 99])
    assert other.streams == [KEYS.routed_requests("e2")]
    assert other.choices[0].reason == REASON_LOAD
    assert route(client, view, "load", [*TENANT_A, 99]).streams == [KEYS.routed_requests("e2")]
    shared = route(client, view, "shared", [*TENANT_A, 99])
    assert shared.streams == [KEYS.requests] and shared.choices[0].reason == REASON_SHARED

    serve(scheduler, [7] * 31, "evictor")  # needs all 8 blocks: tenant A's are evicted
    loop.run_until_complete(publisher.publish_once())
    assert route(client, view, "cache", [*TENANT_A, 99]).streams == [KEYS.routed_requests("e2")]
    assert loop.run_until_complete(client.ttl(KEYS.cache_summary("e1"))) <= CACHE_SUMMARY_TTL_S


def test_a_burst_of_one_prefix_follows_the_first_and_spreads_when_overloaded(
    client: aioredis.Redis,
) -> None:
    async def burst() -> list[str]:
        router = Router(client, KEYS, FixedStatusView(e1=0, e2=0), "cache")  # type: ignore[arg-type]
        streams = []
        for i in range(40):  # nothing published yet: the router's memory keeps them together
            async with router.turn():
                plan = await router.plan([make_request(f"r{i}", [*TENANT_A, i])])
                await client.xadd(plan.streams[0], {"m": b"x"})
                router.commit(plan)
            streams += plan.streams
        return streams

    streams = asyncio.get_event_loop().run_until_complete(burst())
    first = streams[0]
    # The first 17 go together (16 above the idle engine is not yet overloaded), then the
    # two take turns as each in turn gets more than 16 above the other.
    assert streams[:17] == [first] * 17
    assert streams[17] != first
    counts = {s: streams.count(s) for s in set(streams)}
    assert abs(counts[KEYS.routed_requests("e1")] - counts[KEYS.routed_requests("e2")]) <= 17


def test_the_summary_is_sent_whole_again_when_it_vanished_or_was_reset(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = make_scheduler(num_blocks=8, block_size=BLOCK_SIZE)
    serve(scheduler, TENANT_A, "warm")
    publisher = CachePublisher(client, KEYS, "e1", scheduler.kv)
    loop = asyncio.get_event_loop()
    summary = KEYS.cache_summary("e1")
    loop.run_until_complete(publisher.publish_once())
    loop.run_until_complete(client.delete(summary))  # Redis restarted, or the TTL ran out
    monkeypatch.setattr("pagedserve.services.scheduler.cache_publisher.REFRESH_TTL_EVERY_S", 0.0)
    loop.run_until_complete(publisher.publish_once())  # no change: the TTL refresh finds it gone
    assert loop.run_until_complete(client.scard(summary)) == 4
    scheduler.reset_prefix_cache()  # the workers restarted: their KV is gone
    loop.run_until_complete(publisher.publish_once())
    assert loop.run_until_complete(client.exists(summary)) == 0
    serve(scheduler, TENANT_B, "again")
    loop.run_until_complete(publisher.publish_once())
    assert loop.run_until_complete(client.scard(summary)) == 4
    loop.run_until_complete(publisher.withdraw())  # the engine stops
    assert loop.run_until_complete(client.exists(summary)) == 0


def test_a_stalled_turn_delays_the_next_submission_only_boundedly(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pagedserve.services.gateway.router.TURN_WAIT_S", 0.05)
    router = Router(client, KEYS, FixedStatusView(e1=0), "load")  # type: ignore[arg-type]

    async def scenario() -> list[str]:
        order = []
        stalled = asyncio.Event()

        async def stalls() -> None:
            async with router.turn():
                stalled.set()
                await asyncio.sleep(1.0)  # a submission stuck on a stalled Redis
                order.append("stalled")

        async def next_one() -> None:
            await stalled.wait()
            async with router.turn():
                order.append("next")

        await asyncio.gather(stalls(), next_one())
        async with router.turn():  # the lock was given back
            order.append("after")
        return order

    assert asyncio.get_event_loop().run_until_complete(scenario()) == ["next", "stalled", "after"]
