"""An engine holding requests routed to it by cache is killed (SIGKILL) while they stream, on
real processes: once its status expires the other engine claims them from the dead engine's
routed stream and every client sees exactly the fault-free temperature-0 text."""

from __future__ import annotations

import asyncio
import re

import pytest

from pagedserve.shared.protocol import SamplingParams
from pagedserve.shared.status import ENGINE_STATUS_TTL_S
from tests.integration.pipeline.conftest import wait_until_serving
from tests.integration.processes import wait_for
from tests.integration.reliability.cluster import add_engine, add_gateway
from tests.integration.reliability.test_scheduler_crash import (
    CLAIM_BOUND_S,
    MAX_TOKENS,
    assert_idle_and_whole,
    assert_seamless,
    streams_with_fault,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARED_PREFIX = "Paged attention stores the key value cache in fixed size blocks. " * 2
PROMPTS = [SHARED_PREFIX + tail for tail in ("The quick", "Once upon", "Hello,", "Continuous")]
ENGINE_IDS = ("engine-a", "engine-b")


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    for engine_id in ENGINE_IDS:
        add_engine(pipeline, engine_id)
    add_gateway(pipeline, "gw-routed", "--routing", "cache", "--engine-loss-timeout", "120")
    wait_until_serving(pipeline)

    def both_routable() -> bool:  # live, attached (a block size), in the gateway's view soon
        return all(pipeline.engine_status(e).block_size > 0 for e in ENGINE_IDS)

    wait_for("both engines attached", both_routable, 60)
    return pipeline


@pytest.fixture(scope="module")
def expected(reference_engine) -> list[str]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [out.text for out in reference_engine.generate(PROMPTS, params)]


def test_a_killed_engines_routed_requests_finish_exactly_elsewhere(pipeline, expected):
    engines = {e.engine_id: e for e in pipeline.engines}
    killed: list[str] = []

    def kill_the_engine_holding_them() -> None:
        with pipeline.redis() as client:
            routed = {e: client.xlen(pipeline.keys.routed_requests(e)) for e in ENGINE_IDS}
        holder = max(routed, key=routed.__getitem__)
        # One prefix: the first request went to one engine and the rest followed it.
        assert routed[holder] == len(PROMPTS), routed
        engines[holder].scheduler.kill()
        killed.append(holder)

    results, took_s = asyncio.run(
        streams_with_fault(pipeline, kill_the_engine_holding_them, PROMPTS, timeout_s=150)
    )
    (dead,) = killed
    survivor = next(e for e in ENGINE_IDS if e != dead)
    log = engines[survivor].scheduler.log()
    claimed = re.search(rf"claimed (\d+) un-ACKed request\(s\) of dead engine {dead}", log)
    assert claimed and int(claimed.group(1)) == len(PROMPTS), log[-3000:]
    assert_seamless(results, expected)
    assert took_s < ENGINE_STATUS_TTL_S + CLAIM_BOUND_S
    assert_idle_and_whole(pipeline, survivor)
    with pipeline.redis() as client:  # ACKed and deleted on the dead engine's stream
        assert client.xlen(pipeline.keys.routed_requests(dead)) == 0
