"""How long a request's status record stays in Redis, against a real Redis: a day while the
request is open (it may wait that long in a queue), `--finished-request-ttl` once it finished,
aborted or failed, so that a busy server's Redis does not hold a day of finished requests
(~530 bytes each: 4.6 GB a day at 100 requests a second)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pagedserve.services.scheduler.redis_io import RedisIO, StepWrites
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.status import REQUEST_STATUS_TTL_S

pytestmark = pytest.mark.integration

KEYS = RedisKeys("status-ttl")


async def ttls_after(redis_url: str, finished_ttl_s: int | None) -> dict[str, int]:
    """Each request's record TTL after a step that leaves r-open running and ends the others."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        args = () if finished_ttl_s is None else (finished_ttl_s,)
        io = RedisIO(client, KEYS, "engine-ttl", *args)
        writes = StepWrites.empty()
        writes.set_status("r-open", state="running", scheduled_at=1.0)
        for state in ("finished", "aborted", "failed"):
            writes.set_status(f"r-{state}", state="running")
        await io.write_step(writes)
        assert await client.ttl(KEYS.request("r-finished")) > REQUEST_STATUS_TTL_S - 60
        writes = StepWrites.empty()
        for state in ("finished", "aborted", "failed"):
            writes.set_status(f"r-{state}", state=state, finished_at=2.0)
        await io.write_step(writes)
        names = ("open", "finished", "aborted", "failed")
        return {name: await client.ttl(KEYS.request(f"r-{name}")) for name in names}
    finally:
        await client.aclose()


def test_a_finished_requests_record_expires_sooner_than_an_open_ones(redis_url: str) -> None:
    ttls = asyncio.run(ttls_after(redis_url, None))
    assert ttls.pop("open") > REQUEST_STATUS_TTL_S - 60
    assert all(0 < ttl <= 600 for ttl in ttls.values()), ttls  # the default


def test_the_finished_ttl_is_the_schedulers_option(redis_url: str) -> None:
    ttls = asyncio.run(ttls_after(redis_url, 30))
    assert ttls.pop("open") > REQUEST_STATUS_TTL_S - 60
    assert all(0 < ttl <= 30 for ttl in ttls.values()), ttls
