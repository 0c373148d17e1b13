"""A worker or a gateway replica killed with SIGKILL, on real processes.

- Worker killed and none comes back: the scheduler notices within its worker timeout,
  /health turns 503, and after `--worker-recovery-timeout` the in-flight requests end with an
  explicit `engine_error` event; every KV block is free. A new worker then restores service.
  (A worker that does come back in time re-runs the requests seamlessly:
  `tests/integration/pipeline/test_recovery.py`.)
- Gateway replica killed: the engine aborts that gateway's requests once its heartbeat key has
  been missing at two checks (the test expires the key at once instead of waiting out its
  TTL), freeing their blocks; the other replica serves as if nothing
  happened.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import httpx
import pytest

from pagedserve.shared.protocol import SamplingParams
from tests.integration.pipeline.conftest import NUM_BLOCKS, wait_until_serving
from tests.integration.processes import wait_for
from tests.integration.reliability.cluster import (
    PROMPTS,
    StreamResult,
    add_engine,
    add_gateway,
    health,
    start_worker,
    stream_completion,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = "engine-c"
WORKER_TIMEOUT_S = 5  # cluster.scheduler_args
RECOVERY_TIMEOUT_S = 3
MAX_TOKENS = 200
BODY = {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
NUM_DOOMED = 160  # 32 000 tokens: about 50 s of work at 600 tokens/s, 2 at a time
SLACK_S = 10  # status refresh, log polling, a loaded 2-core machine


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    # Two sequences at a time: the gateway test needs requests that outlive a heartbeat TTL.
    add_engine(pipeline, ENGINE, "--worker-recovery-timeout", str(RECOVERY_TIMEOUT_S),
               "--max-num-seqs", "2")  # fmt: skip
    add_gateway(pipeline, "gw-c0")
    add_gateway(pipeline, "gw-c1")
    wait_until_serving(pipeline)
    return pipeline


def all_blocks_free(pipeline) -> bool:
    status = pipeline.engine_status(ENGINE)
    return (
        status.num_running == status.num_waiting == 0
        and status.num_free_blocks == status.num_total_blocks > 0
    )


def request_states(pipeline, gateway_id: str) -> Counter:
    """How many of a gateway's requests are in each state (from the request status hashes)."""
    with pipeline.redis() as client:
        records = [client.hgetall(key) for key in client.scan_iter(pipeline.keys.request("*"))]
    mine = [r for r in records if r.get(b"gateway_id") == gateway_id.encode()]
    return Counter(r[b"state"].decode() for r in mine)


async def start_streams(pipeline, gateway: int, prompts: list[str], client: httpx.AsyncClient):
    results = [StreamResult() for _ in prompts]
    tasks = [
        asyncio.create_task(
            stream_completion(client, pipeline.base_url(gateway), {**BODY, "prompt": p}, r)
        )
        for p, r in zip(prompts, results, strict=True)
    ]
    return results, tasks


def test_a_killed_worker_that_never_returns_fails_requests_with_a_clear_error(
    pipeline, reference_engine
):
    engine = pipeline.engines[0]

    async def scenario() -> tuple[list[StreamResult], float, float]:
        async with httpx.AsyncClient(timeout=120) as client:
            results, tasks = await start_streams(pipeline, 0, PROMPTS[:2], client)
            while any(r.first_piece_at is None for r in results):
                assert not any(t.done() for t in tasks), results
                await asyncio.sleep(0.01)
            await asyncio.to_thread(engine.workers[0].kill)
            killed_at = time.monotonic()
            noticed_s = await asyncio.to_thread(
                wait_for, "/health 503", lambda: health(pipeline) == 503,
                WORKER_TIMEOUT_S + SLACK_S,
            )  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            return results, noticed_s, time.monotonic() - killed_at

    results, noticed_s, ended_s = asyncio.run(scenario())
    assert noticed_s < WORKER_TIMEOUT_S + SLACK_S
    assert ended_s < WORKER_TIMEOUT_S + RECOVERY_TIMEOUT_S + SLACK_S
    for result in results:
        assert result.status == 200 and result.done, result
        assert result.error is not None, result
        assert result.error["error"]["reason"] == "engine_error"
        assert "lost its workers" in result.error["error"]["message"]
        assert "none came back within 3s" in result.error["error"]["message"]
    wait_for("every block free", lambda: all_blocks_free(pipeline), 10)

    # A new worker attaches and service is back, with the undisturbed text.
    start_worker(pipeline, engine, NUM_BLOCKS)
    wait_for("/health ok again", lambda: health(pipeline) == 200, 60)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    [expected] = reference_engine.generate(PROMPTS[:1], params)
    answer = httpx.post(f"{pipeline.base_url()}/v1/completions",
                        json={**BODY, "prompt": PROMPTS[0]}, timeout=60)  # fmt: skip
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == expected.text


def test_a_killed_gateway_has_its_requests_aborted_and_the_other_serves(pipeline, reference_engine):
    engine = pipeline.engines[0]
    doomed = pipeline.gateways[0]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [out.text for out in reference_engine.generate(PROMPTS, params)]
    offset = len(engine.scheduler.log())
    states_before = request_states(pipeline, "gw-c0")  # from the test before

    async def scenario() -> list[StreamResult]:
        # The bounds below are generous: on a loaded 2-core box queuing and streaming are slow,
        # and slowness is not what this test is about.
        async with httpx.AsyncClient(timeout=300) as client:
            # Requests through gw-c0 with 2 running at a time: far longer than the TTL.
            prompts = PROMPTS * (NUM_DOOMED // len(PROMPTS))
            doomed_results, _ = await start_streams(pipeline, 0, prompts, client)

            def all_queued() -> bool:
                states = request_states(pipeline, "gw-c0") - states_before
                return sum(states.values()) == NUM_DOOMED

            await asyncio.to_thread(wait_for, "gw-c0's requests queued", all_queued, 300)
            while all(r.first_piece_at is None for r in doomed_results):
                await asyncio.sleep(0.01)
            await asyncio.to_thread(doomed.kill)
            # Expire its heartbeat now, as Redis does GATEWAY_HEARTBEAT_TTL_S after the last
            # beat: waiting out the TTL too would let a fast machine finish every doomed
            # request first, leaving nothing to abort. What the engine does from here on (two
            # missed checks, then abort) is what this test is about.
            with pipeline.redis() as redis_client:
                redis_client.delete(pipeline.keys.gateway("gw-c0"))
            results, tasks = await start_streams(pipeline, 1, PROMPTS, client)
            await asyncio.wait_for(asyncio.gather(*tasks), 300)
            return results

    results = asyncio.run(scenario())
    for result, text in zip(results, expected, strict=True):
        assert result.status == 200 and result.error is None and result.done, result
        assert result.text == text

    def aborted() -> bool:
        return "gateway gw-c0 is gone" in engine.scheduler.log()[offset:]

    wait_for("gw-c0's requests aborted", aborted, 3 * 3 + SLACK_S)
    found = re.search(r"gateway gw-c0 is gone.*aborting its (\d+) request", engine.scheduler.log())
    assert found and int(found.group(1)) >= 1
    wait_for("every block free", lambda: all_blocks_free(pipeline), 30)
    states = request_states(pipeline, "gw-c0") - states_before
    assert sum(states.values()) == NUM_DOOMED, states
    # Every one is accounted for, and those still queued when gw-c0 was found dead were
    # aborted rather than run for nobody (how many depends on the machine's speed).
    assert set(states) <= {"finished", "aborted"} and states["aborted"] >= 1, states
    with pipeline.redis() as client:
        assert client.xlen(pipeline.keys.requests) == 0
