"""The engine gauges a step writes, against a real Redis: only the gauge fields (the whole
status record is the periodic writer's), nothing when they did not move, and a record that
still reads when the step's write is all there is of it."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.services.scheduler.status_reporter import GAUGE_FIELDS, StatusReporter
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import GenerateRequest, SamplingParams
from pagedserve.shared.status import EngineStatus, from_fields
from tests.unit.scheduler.helpers import make_scheduler

pytestmark = pytest.mark.integration

KEYS = RedisKeys("gauges")
ENGINE = "engine-g"


async def scenario(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    key = KEYS.engine(ENGINE)
    await client.delete(key)
    scheduler = make_scheduler()
    io = RedisIO(client, KEYS, ENGINE)
    outbox = Outbox(io, RedisBackoff())
    link = WorkerLink("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", 1, 16)  # never contacted
    ledger = Ledger(scheduler, outbox, ENGINE)
    reporter = StatusReporter(io, link, scheduler, ledger, asyncio.Event())

    # the periodic writer's whole record, then a field the step must leave alone
    await io.write_engine_status(reporter.status(workers_alive=True))
    whole = await client.hgetall(key)
    assert len(whole) > 2 * len(GAUGE_FIELDS)
    await client.hset(key, "num_steps", "41")

    reporter.after_step(outbox)  # the first step after start: the gauges are new
    await outbox.flush()
    scheduler.add_request(GenerateRequest("r-0", [1, 2, 3, 4, 5], SamplingParams(max_tokens=2)))
    scheduler.schedule()  # running 1, blocks taken
    before = await client.hgetall(key)
    reporter.after_step(outbox)
    assert outbox, "the gauges moved: the step must write them"
    await outbox.flush()
    after = await client.hgetall(key)
    changed = {k.decode() for k in after if after[k] != before.get(k)}
    assert changed <= GAUGE_FIELDS and {"num_running", "num_free_blocks"} <= changed
    assert after[b"num_steps"] == b"41" and set(after) == set(whole)
    status = from_fields(EngineStatus, after)
    assert (status.num_running, status.num_waiting) == (1, 0)
    assert status.num_free_blocks == scheduler.stats().num_free_blocks

    reporter.after_step(outbox)  # nothing moved: nothing to write
    assert not outbox

    # the key lost (Redis restarted empty): the step's fields alone read as a record, and expire
    await client.delete(key)
    scheduler.add_request(GenerateRequest("r-1", [6, 7, 8, 9, 10], SamplingParams(max_tokens=2)))
    scheduler.schedule()
    reporter.after_step(outbox)
    await outbox.flush()
    alone = from_fields(EngineStatus, await client.hgetall(key))
    assert (alone.engine_id, alone.num_running) == (ENGINE, 2)
    assert await client.ttl(key) > 0
    await client.aclose()


def test_a_step_writes_only_the_gauges_that_moved(redis_url: str) -> None:
    asyncio.run(scenario(redis_url))
