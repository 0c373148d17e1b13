"""The engine gauges a step writes, against a real Redis: only the gauge fields (the whole
status record is the periodic writer's), nothing when they did not move or moved again within
`GAUGE_INTERVAL_S`, but the whole record at once when the engine empties; a record that still
reads when the step's write is all there is of it; and a step of one command sent without
MULTI/EXEC."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pagedserve.services.scheduler import status_reporter
from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO, StepWrites
from pagedserve.services.scheduler.status_reporter import GAUGE_FIELDS, StatusReporter
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, TokenDelta
from pagedserve.shared.status import EngineStatus, from_fields
from tests.unit.scheduler.helpers import make_scheduler

pytestmark = pytest.mark.integration

KEYS = RedisKeys("gauges")
ENGINE = "engine-g"


def parts(client: aioredis.Redis):
    """A scheduler, its outbox and status reporter on `client`; the workers never contacted."""
    scheduler = make_scheduler()
    io = RedisIO(client, KEYS, ENGINE)
    outbox = Outbox(io, RedisBackoff())
    link = WorkerLink("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", 1, 16)
    ledger = Ledger(scheduler, outbox, ENGINE)
    return scheduler, io, outbox, StatusReporter(io, link, scheduler, ledger, asyncio.Event())


def admit(scheduler, request_id: str) -> None:
    """A request that the next plan runs: running +1, blocks taken."""
    scheduler.add_request(
        GenerateRequest(request_id, [1, 2, 3, 4, 5], SamplingParams(max_tokens=2))
    )
    scheduler.schedule()


async def scenario(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    key = KEYS.engine(ENGINE)
    await client.delete(key)
    scheduler, io, outbox, reporter = parts(client)

    # the periodic writer's whole record; then a field a busy step must leave alone
    await io.write_engine_status(reporter.status(workers_alive=True))
    whole = await client.hgetall(key)
    assert len(whole) > 2 * len(GAUGE_FIELDS)
    reporter.after_step(outbox)  # the first step after start: empty, the whole record again
    await outbox.flush()
    await client.hset(key, "num_steps", "41")
    admit(scheduler, "r-0")
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
    admit(scheduler, "r-1")
    reporter.after_step(outbox)
    await outbox.flush()
    alone = from_fields(EngineStatus, await client.hgetall(key))
    assert (alone.engine_id, alone.num_running) == (ENGINE, 2)
    assert await client.ttl(key) > 0
    await client.aclose()


def test_a_step_writes_only_the_gauges_that_moved(redis_url: str, monkeypatch) -> None:
    monkeypatch.setattr(status_reporter, "GAUGE_INTERVAL_S", 0.0)
    asyncio.run(scenario(redis_url))


async def interval_scenario(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    scheduler, _, outbox, reporter = parts(client)
    admit(scheduler, "r-0")
    reporter.after_step(outbox)  # the first gauges go out: running 1
    await outbox.flush()
    admit(scheduler, "r-1")
    reporter.after_step(outbox)
    assert not outbox, "moved again within the interval: held back"
    scheduler.abort_requests(["r-0", "r-1"], "abort")  # emptied: the whole record at once
    reporter.after_step(outbox)
    assert outbox
    await outbox.flush()
    status = from_fields(EngineStatus, await client.hgetall(KEYS.engine(ENGINE)))
    assert (status.num_running, status.num_waiting) == (0, 0)
    assert status.num_finished == 2  # the counters too, not just the gauges
    await client.aclose()


def test_gauges_that_move_again_within_the_interval_wait_unless_the_engine_emptied(
    redis_url: str, monkeypatch
) -> None:
    monkeypatch.setattr(status_reporter, "GAUGE_INTERVAL_S", 3600.0)
    asyncio.run(interval_scenario(redis_url))


async def command_counts(client: aioredis.Redis, writes: StepWrites) -> dict[str, int]:
    """The commands Redis ran for `writes`, by name."""
    await client.config_resetstat()
    await RedisIO(client, KEYS, ENGINE).write_step(writes)
    stats = await client.info("commandstats")
    counts = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    counts.pop("config", None)  # the reset's own
    return counts


async def transaction_scenario(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    outputs = {"gw": [TokenDelta(request_id="r", token_ids=[7])]}
    alone = StepWrites(outputs, {}, {})
    assert alone.num_commands == 1
    assert await command_counts(client, alone) == {"xadd": 1}  # atomic alone: no MULTI/EXEC
    several = StepWrites(outputs, {}, {"r": {"state": "running"}}, {"num_running": "1"})
    counts = await command_counts(client, several)
    assert (counts["multi"], counts["exec"]) == (1, 1)
    assert sum(counts.values()) - 2 == several.num_commands == 6
    await client.aclose()


def test_a_step_of_one_command_sends_it_without_a_transaction(redis_url: str) -> None:
    asyncio.run(transaction_scenario(redis_url))
