"""Data and tensor parallelism through the real pipeline: two engine replicas (one TP=1, one
TP=2 over gloo) consuming the same request stream behind one gateway."""

from __future__ import annotations

import asyncio
import collections

import pytest

from pagedserve.shared.protocol import SamplingParams
from tests.integration.pipeline.conftest import add_engine, add_gateway, wait_until_serving
from tests.integration.processes import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TP1, TP2 = "engine-tp1", "engine-tp2"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, TP1, 1)
    add_engine(pipeline, TP2, 2)
    # the shared stream, which both engines read (routing by cache has its own tests)
    add_gateway(pipeline, "gw-replicas", "--routing", "shared")
    wait_until_serving(pipeline)
    return pipeline


def complete_all(pipeline, prompts: list[str]) -> list[str]:
    async def run() -> list[str]:
        client = pipeline.async_client()
        try:
            model = (await client.models.list()).data[0].id
            answers = await asyncio.gather(
                *(
                    client.completions.create(
                        model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0
                    )
                    for p in prompts
                )
            )
        finally:
            await client.close()
        return [a.choices[0].text for a in answers]

    return asyncio.run(run())


def reference_texts(reference_engine, prompts: list[str]) -> list[str]:
    results = reference_engine.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    )
    return [r.text for r in results]


def finished_per_engine(pipeline) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    prefix = pipeline.keys.request("")
    with pipeline.redis() as client:
        for key in client.scan_iter(match=f"{prefix}*"):
            fields = client.hgetall(key)
            if fields.get(b"state") == b"finished":
                counts[fields[b"engine_id"].decode()] += 1
    return counts


def test_two_engines_share_the_stream_and_agree_with_the_in_process_engine(
    pipeline, reference_engine
):
    prompts = [f"Once upon a time {i}" for i in range(32)]
    assert complete_all(pipeline, prompts) == reference_texts(reference_engine, prompts)
    counts = finished_per_engine(pipeline)
    assert sum(counts.values()) == 32
    assert counts[TP1] > 0 and counts[TP2] > 0, counts
    # Engine status records are rewritten about once a second, and the ACK + XDEL follow
    # the output that the client already read: give both a moment.
    wait_for(
        "engine stats to count every finished request",
        lambda: (
            [pipeline.engine_status(e).num_finished for e in (TP1, TP2)]
            == [counts[TP1], counts[TP2]]
        ),
        timeout_s=5,
    )
    with pipeline.redis() as client:  # every request ACKed and deleted: nothing left queued
        wait_for("the request stream to empty", lambda: client.xlen(pipeline.keys.requests) == 0, 5)


def test_tensor_parallel_2_gives_the_same_greedy_text_as_tp1(pipeline, reference_engine):
    tp1 = next(e for e in pipeline.engines if e.engine_id == TP1)
    assert tp1.scheduler.stop() == 0  # SIGTERM: a clean exit; TP2 now serves everything
    before = finished_per_engine(pipeline)[TP2]
    prompts = ["The quick brown fox", "Continuous batching adds", "Hello, world!"]
    assert complete_all(pipeline, prompts) == reference_texts(reference_engine, prompts)
    assert finished_per_engine(pipeline)[TP2] == before + len(prompts)
