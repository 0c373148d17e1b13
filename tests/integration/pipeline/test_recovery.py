"""Failures through the real pipeline: a worker killed mid-generation is detected, /health
turns false, and once a new worker attaches the in-flight request is recomputed and completes
with the text it would have had."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from shared.protocol import SamplingParams
from tests.integration.pipeline.conftest import (
    NUM_BLOCKS,
    add_engine,
    add_gateway,
    wait_until_serving,
)
from tests.integration.processes import scheduler_process, worker_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE_ID = "engine-recovery"
MAX_TOKENS = 120
PROMPT = "Paged attention stores"


@pytest.fixture(scope="module")
def pipeline(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, ENGINE_ID)
    add_gateway(pipeline, "gw-recovery")
    wait_until_serving(pipeline)
    return pipeline


def health(pipeline) -> int:
    return httpx.get(f"{pipeline.base_url()}/health", timeout=5).status_code


def test_a_killed_worker_is_detected_and_its_requests_finish_on_the_replacement(
    pipeline, reference_engine
):
    [expected] = reference_engine.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    engine = pipeline.engines[0]
    model = pipeline.client().models.list().data[0].id
    outcome: dict[str, object] = {}

    def ask() -> None:
        try:
            answer = pipeline.client().completions.create(
                model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            outcome["answer"] = answer
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.monotonic() + 20
    while pipeline.engine_status(ENGINE_ID).num_running == 0:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.05)
    engine.workers[0].kill()
    killed_at = time.monotonic()

    # Detected within the worker timeout (5 s) plus a status refresh.
    while pipeline.engine_status(ENGINE_ID).workers_alive or health(pipeline) == 200:
        assert time.monotonic() - killed_at < 9, "the dead worker was not noticed"
        time.sleep(0.1)
    assert "workers lost" in engine.scheduler.log()
    assert thread.is_alive(), "the request ended although its worker died"

    offset = len(engine.scheduler.log())
    replacement = worker_process(
        "worker-replacement", pipeline.model_dir, engine.plan_port, engine.result_port,
        "--num-blocks", str(NUM_BLOCKS), "--scheduler-timeout", "5",
    ).start()  # fmt: skip
    engine.workers.append(replacement)
    engine.scheduler.wait_for_log("worker rank 0 attached", timeout_s=60, after=offset)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    choice = outcome["answer"].choices[0]
    assert choice.text == expected.text
    assert outcome["answer"].usage.completion_tokens == MAX_TOKENS
    deadline = time.monotonic() + 5
    while health(pipeline) != 200 or pipeline.engine_status(ENGINE_ID).num_running:
        assert time.monotonic() < deadline, "/health did not recover or the request still runs"
        time.sleep(0.1)
    status = pipeline.engine_status(ENGINE_ID)
    assert status.num_preemptions >= 1 and status.num_free_blocks == status.num_total_blocks


def test_the_scheduler_exits_cleanly_on_sigterm_and_the_worker_waits(pipeline):
    engine = pipeline.engines[0]
    worker = engine.workers[-1]
    assert engine.scheduler.stop() == 0
    assert "scheduler engine-recovery exits" in engine.scheduler.log()
    with pipeline.redis() as client:
        fields = client.hgetall(pipeline.keys.engine(ENGINE_ID))
    assert fields[b"workers_alive"] == b"0"
    time.sleep(0.5)
    assert worker.is_alive(), "a worker must outlive its scheduler (another may take it over)"


def test_a_crashed_scheduler_restarted_with_its_id_finishes_its_requests_without_duplicates(
    pipeline, reference_engine
):
    """Kill -9 the scheduler mid-generation and start it again under the same engine id: it
    re-reads its un-ACKed request, the waiting worker attaches to the new epoch, the request is
    recomputed and the client gets exactly the text it would have had."""
    [expected] = reference_engine.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    engine = pipeline.engines[0]

    def start_scheduler(name: str):
        scheduler = scheduler_process(
            name, pipeline.redis_url, pipeline.namespace, ENGINE_ID, engine.plan_port,
            engine.result_port, "--worker-timeout", "5", "--max-num-batched-tokens", "512",
        ).start()  # fmt: skip
        engine.scheduler = scheduler
        return scheduler

    start_scheduler("scheduler-second").wait_for_log("workers ready", timeout_s=30)
    model = pipeline.client().models.list().data[0].id
    outcome: dict[str, object] = {}

    def ask() -> None:
        try:
            chunks = pipeline.client().completions.create(
                model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            outcome["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=ask)
    thread.start()
    deadline = time.monotonic() + 20
    while pipeline.engine_status(ENGINE_ID).num_running == 0:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.05)
    time.sleep(0.5)  # some tokens have reached the client
    engine.scheduler.kill()
    third = start_scheduler("scheduler-third")
    third.wait_for_log("resuming 1 un-ACKed request(s)", timeout_s=30)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["text"] == expected.text
