"""A scheduler killed with SIGKILL while requests stream, on real processes.

The tests run in order on one pipeline (one gateway, `--engine-loss-timeout 4`):
1. engine-a's scheduler is killed and restarted under the same engine id: it re-reads its own
   un-ACKed entries and regenerates them; the gateway drops the replayed tokens, so every
   client sees exactly the undisturbed temperature-0 text.
2. engine-a's scheduler is killed for good while engine-b runs: once engine-a's status expires,
   engine-b claims its entries (XPENDING + XCLAIM) and finishes them, again seamlessly.
3. engine-b is killed too and nothing replaces it: open streams end with an explicit error
   event within ENGINE_STATUS_TTL_S + the gateway's engine-loss timeout; none hangs.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from pagedserve.shared.protocol import SamplingParams
from pagedserve.shared.status import ENGINE_STATUS_TTL_S
from tests.integration.pipeline.conftest import wait_until_serving
from tests.integration.processes import wait_for
from tests.integration.reliability.cluster import (
    PROMPTS,
    StreamResult,
    add_engine,
    add_gateway,
    start_scheduler,
    stream_completion,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 200
ENGINE_LOSS_TIMEOUT_S = 4
# Bounds with room for a loaded 2-core machine (process start-up is most of the first).
RESTART_BOUND_S = 60  # kill -> every stream finished, restart included
CLAIM_BOUND_S = 45  # after the dead engine's status expires: claim round, idle bound, regenerate
SLACK_S = 10  # status refresh (1 s), gateway watch (2 s), scheduling noise
BODY = {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, "engine-a")
    # the shared stream, which the claim of a dead engine's entries was built on (routed
    # streams have their own crash test, test_routed_engine_crash.py)
    add_gateway(pipeline, "gw-crash", "--engine-loss-timeout", str(ENGINE_LOSS_TIMEOUT_S),
                "--routing", "shared")  # fmt: skip
    wait_until_serving(pipeline)
    return pipeline


@pytest.fixture(scope="module")
def expected(reference_engine) -> list[str]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [out.text for out in reference_engine.generate(PROMPTS, params)]


async def streams_with_fault(
    pipeline, fault, prompts=PROMPTS, timeout_s: float = 90.0, bodies: list[dict] | None = None
):
    """Stream every prompt at once (with BODY, or with `bodies`, one per prompt); once each
    client has seen text (or its stream ended), run `fault()` (blocking, in a thread); return
    the results and the seconds from the fault to the last stream end."""
    results = [StreamResult() for _ in prompts]
    bodies = bodies or [BODY] * len(prompts)
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        tasks = [
            asyncio.create_task(
                stream_completion(client, pipeline.base_url(), {**b, "prompt": p}, r)
            )
            for p, b, r in zip(prompts, bodies, results, strict=True)
        ]
        deadline = time.monotonic() + 30
        # On a fast box the first streams can end before the last have started: they are
        # checked like the rest afterwards; the fault waits until every stream started or ended.
        pairs = list(zip(results, tasks, strict=True))
        while any(r.first_piece_at is None and not t.done() for r, t in pairs):
            assert time.monotonic() < deadline, f"streams never started: {results}"
            await asyncio.sleep(0.01)
        assert not all(t.done() for t in tasks), "every stream ended before the fault"
        await asyncio.to_thread(fault)
        faulted_at = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
    return results, time.monotonic() - faulted_at


def assert_seamless(results: list[StreamResult], expected: list[str]) -> None:
    for result, text in zip(results, expected, strict=True):
        assert result.status == 200 and result.error is None, result
        assert result.done and result.finish_reason == "length"
        assert result.text == text  # nothing repeated, nothing missing
        assert result.num_completion_tokens == MAX_TOKENS


def assert_idle_and_whole(pipeline, engine_id: str) -> None:
    def idle() -> bool:
        status = pipeline.engine_status(engine_id)
        return status.num_running == status.num_waiting == 0 and (
            status.num_free_blocks == status.num_total_blocks > 0
        )

    wait_for(f"{engine_id} idle with every block free", idle, 10)
    with pipeline.redis() as client:
        assert client.xlen(pipeline.keys.requests) == 0  # everything ACKed and deleted


def test_a_restarted_scheduler_resumes_its_requests_without_repeating_text(pipeline, expected):
    engine = pipeline.engines[0]

    def crash_and_restart() -> None:
        engine.scheduler.kill()
        engine.scheduler = start_scheduler(pipeline, engine)

    # Plus one sampled stream without a seed: the gateway gives it one, so its replay
    # regenerates what its client was shown instead of ending in a replay-mismatch error.
    sampled = {"temperature": 0.9, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    prompts = [*PROMPTS, PROMPTS[0]]
    bodies = [BODY] * len(PROMPTS) + [sampled]
    results, took_s = asyncio.run(
        streams_with_fault(pipeline, crash_and_restart, prompts, bodies=bodies)
    )
    log = engine.scheduler.log()
    resumed = re.search(r"resuming (\d+) un-ACKed request\(s\) of engine engine-a", log)
    assert resumed and int(resumed.group(1)) >= 1, log[-3000:]
    assert_seamless(results[: len(PROMPTS)], expected)
    sampled_result = results[-1]
    assert sampled_result.status == 200 and sampled_result.error is None, sampled_result
    assert sampled_result.done and sampled_result.finish_reason == "length"
    assert sampled_result.num_completion_tokens == MAX_TOKENS
    assert took_s < RESTART_BOUND_S
    assert_idle_and_whole(pipeline, "engine-a")


def test_another_replica_claims_a_dead_engines_requests(pipeline, expected):
    engine_a = pipeline.engines[0]
    engine_b = add_engine(pipeline, "engine-b")
    engine_b.scheduler.wait_for_log("workers ready", 90)
    # engine-b's scheduler is stopped (its worker waits) while the requests arrive, so that
    # engine-a takes all of them; it starts again right after engine-a's crash. (Pausing it
    # with SIGSTOP would not do: Redis still hands entries to its blocked XREADGROUP.)
    assert engine_b.scheduler.stop() == 0

    def crash_a_and_start_b() -> None:
        engine_a.scheduler.kill()
        engine_b.scheduler = start_scheduler(pipeline, engine_b)

    results, took_s = asyncio.run(streams_with_fault(pipeline, crash_a_and_start_b))
    log = engine_b.scheduler.log()
    claimed = re.search(r"claimed (\d+) un-ACKed request\(s\) of dead engine engine-a", log)
    assert claimed and int(claimed.group(1)) >= 1, log[-3000:]
    assert_seamless(results, expected)
    # engine-a's status expires, then a claim round (5 s) with entries idle >= 10 s.
    assert took_s < ENGINE_STATUS_TTL_S + CLAIM_BOUND_S
    assert_idle_and_whole(pipeline, "engine-b")

    def dead_consumer_removed() -> bool:  # at the claim round after the one that emptied it
        with pipeline.redis() as client:
            infos = client.xinfo_consumers(pipeline.keys.requests, "engines")
        return b"engine-a" not in {info["name"] for info in infos}

    wait_for("engine-a removed from the group", dead_consumer_removed, 15)


def test_with_no_engine_left_open_streams_end_with_an_error_event(pipeline):
    engine_b = pipeline.engines[1]
    results, took_s = asyncio.run(
        streams_with_fault(pipeline, engine_b.scheduler.kill, prompts=PROMPTS[:2])
    )
    for result in results:
        assert result.status == 200 and result.done, result
        assert result.error is not None and result.error["error"]["reason"] == "no_live_engine"
        assert "no engine has been live" in result.error["error"]["message"]
    # The last status ages out (TTL), then the gateway waits its engine-loss timeout.
    assert took_s < ENGINE_STATUS_TTL_S + ENGINE_LOSS_TIMEOUT_S + SLACK_S
    # A new request now is refused at once with a retryable 503, not queued forever.
    answer = httpx.post(f"{pipeline.base_url()}/v1/completions", json={**BODY, "prompt": "x"},
                        timeout=30)  # fmt: skip
    assert answer.status_code == 503 and answer.json()["error"]["reason"] == "no_live_engine"
