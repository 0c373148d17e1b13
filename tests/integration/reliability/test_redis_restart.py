"""Redis restarted (without persistence, so every key is lost) under a serving pipeline: the
services log the outage, back off and reconnect, none exits or restarts in a loop, a stream
open across the outage finishes with its exact text, new requests are served again, and a
request that was still queued (lost with Redis's data) is queued again by its gateway."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from pagedserve.shared.protocol import SamplingParams
from tests.integration.conftest import RedisServer
from tests.integration.pipeline.conftest import new_pipeline, wait_until_serving
from tests.integration.processes import wait_for
from tests.integration.reliability.cluster import (
    StreamResult,
    add_engine,
    add_gateway,
    health,
    start_scheduler,
    stream_completion,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 200
OUTAGE_S = 3.0
BODY = {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
PROMPT = "Hello, world! How are"


@pytest.fixture(scope="module")
def own_redis():
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pipeline(own_redis, served_model_dir):
    pipeline = new_pipeline(own_redis.url, served_model_dir)
    try:
        add_engine(pipeline, "engine-r")
        add_gateway(pipeline, "gw-r")
        wait_until_serving(pipeline)
        yield pipeline
    finally:
        pipeline.stop()


def test_services_reconnect_after_a_redis_restart(pipeline, own_redis, reference_engine):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    [expected] = [out.text for out in reference_engine.generate([PROMPT], params)]
    health_during_outage: list[int] = []

    async def stream_across_outage() -> StreamResult:
        result = StreamResult()
        async with httpx.AsyncClient(timeout=120) as client:
            task = asyncio.create_task(
                stream_completion(client, pipeline.base_url(), {**BODY, "prompt": PROMPT}, result)
            )
            while result.first_piece_at is None:
                assert not task.done(), result
                await asyncio.sleep(0.01)
            own_redis.process.terminate()  # type: ignore[union-attr]
            await asyncio.to_thread(own_redis.process.wait, 10)  # type: ignore[union-attr]
            await asyncio.sleep(1.0)
            health_during_outage.append(await asyncio.to_thread(health, pipeline))
            await asyncio.sleep(OUTAGE_S)
            os.makedirs(own_redis.dir, exist_ok=True)
            await asyncio.to_thread(own_redis.start)
            return await asyncio.wait_for(task, 90)

    result = asyncio.run(stream_across_outage())
    assert health_during_outage == [503]
    assert result.status == 200 and result.error is None, result
    assert result.done and result.text == expected  # outputs kept and written once Redis is back

    for process in pipeline.processes():
        assert process.is_alive(), f"{process.name} exited:\n{process.tail()}"
    scheduler_log = pipeline.engines[0].scheduler.log()
    gateway_log = pipeline.gateways[0].log()
    assert "retrying in" in scheduler_log  # the outage is reported, with the backoff
    assert "failed" in gateway_log
    assert scheduler_log.count("scheduler ready") == 1  # never restarted
    wait_for("/health ok again", lambda: health(pipeline) == 200, 30)

    answer = httpx.post(
        f"{pipeline.base_url()}/v1/completions", json={**BODY, "prompt": PROMPT}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == expected

    with pipeline.redis() as client:  # the group is back and nothing is left un-ACKed
        assert client.xlen(pipeline.keys.requests) == 0
        groups = client.xinfo_groups(pipeline.keys.requests)
        assert [g["name"] for g in groups] == [b"engines"] and groups[0]["pending"] == 0


def test_a_request_still_queued_when_redis_lost_its_data_is_queued_again(
    pipeline, own_redis, reference_engine
):
    prompt = "Once upon a time there"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    [expected] = [out.text for out in reference_engine.generate([prompt], params)]
    engine = pipeline.engines[0]
    offset = len(pipeline.gateways[0].log())

    # the shared stream, or the engine's own when the gateway routes by cache (its status is
    # still fresh while the scheduler is stopped)
    streams = [pipeline.keys.requests, pipeline.keys.routed_requests(engine.engine_id)]

    def queued() -> bool:
        with pipeline.redis() as client:
            return sum(client.xlen(stream) for stream in streams) == 1

    async def scenario() -> StreamResult:
        async with httpx.AsyncClient(timeout=120) as client:
            # The scheduler is stopped (its worker waits), so the request sits unread in the
            # stream when Redis dies; then it starts again under the same engine id. (Pausing
            # it with SIGSTOP would not do: Redis still hands entries to a blocked XREADGROUP.)
            assert await asyncio.to_thread(engine.scheduler.stop) == 0
            task = asyncio.create_task(
                stream_completion(client, pipeline.base_url(), {**BODY, "prompt": prompt})
            )
            await asyncio.to_thread(wait_for, "request queued", queued, 10)
            own_redis.process.terminate()  # type: ignore[union-attr]
            await asyncio.to_thread(own_redis.process.wait, 10)  # type: ignore[union-attr]
            os.makedirs(own_redis.dir, exist_ok=True)
            await asyncio.to_thread(own_redis.start)
            engine.scheduler = start_scheduler(pipeline, engine)
            return await asyncio.wait_for(task, 90)

    result = asyncio.run(scenario())
    assert result.status == 200 and result.error is None, result
    assert result.done and result.text == expected
    assert "1 of 1 open request(s) lost, queued again" in pipeline.gateways[0].log()[offset:]
    with pipeline.redis() as client:
        assert sum(client.xlen(stream) for stream in streams) == 0
