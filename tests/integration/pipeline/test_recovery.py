"""Failures through the real pipeline: a worker killed mid-generation is detected, /health
turns false, and once a new worker attaches the in-flight request is recomputed and completes
with the text it would have had; a scheduler killed mid-generation and restarted under its
engine id resumes its requests without duplicating text."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from pagedserve.shared.protocol import SamplingParams
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


@pytest.fixture(scope="module", params=["sync", "async-scheduling"])
def scheduler_args(request) -> tuple[str, ...]:
    """Every test twice: with async scheduling a lost worker takes two plans with it."""
    return ("--async-scheduling",) * (request.param != "sync")


@pytest.fixture(scope="module")
def pipeline(pipeline_factory, scheduler_args):
    pipeline = pipeline_factory()
    add_engine(pipeline, ENGINE_ID, 1, *scheduler_args)
    # A replacement worker can take over 30 s (the gateway's default engine-loss bound) to load
    # on a busy machine; this module tests recovery, not that bound.
    add_gateway(pipeline, "gw-recovery", "--engine-loss-timeout", "300")
    wait_until_serving(pipeline)
    return pipeline


@pytest.fixture(scope="module")
def expected_text(reference_engine) -> str:
    [result] = reference_engine.generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    )
    return result.text


def health(pipeline) -> int:
    return httpx.get(f"{pipeline.base_url()}/health", timeout=5).status_code


class StreamingRequest:
    """One greedy streaming completion in a thread; `first_chunk` is set as soon as the
    client has received text, so a failure can be injected mid-generation at any speed."""

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self.first_chunk = threading.Event()
        self.text = ""
        self.usage = None
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.first_chunk.wait(timeout=30), f"no first chunk: {self.error}"

    def _run(self) -> None:
        client = self.pipeline.client()
        try:
            model = client.models.list().data[0].id
            chunks = client.completions.create(
                model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )  # fmt: skip
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].text:
                    self.text += chunk.choices[0].text
                    self.first_chunk.set()
                self.usage = chunk.usage or self.usage
        except Exception as exc:  # reported by the test's assertions
            self.error = exc
        finally:
            self.first_chunk.set()

    def result(self, timeout_s: float = 90.0) -> str:
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), "the request never finished"
        assert self.error is None, self.error
        return self.text


def test_a_killed_worker_is_detected_and_its_requests_finish_on_the_replacement(
    pipeline, expected_text
):
    engine = pipeline.engines[0]
    request = StreamingRequest(pipeline)
    engine.workers[0].kill()
    killed_at = time.monotonic()

    # Detected within the worker timeout (5 s) plus a status refresh.
    while pipeline.engine_status(ENGINE_ID).workers_alive or health(pipeline) == 200:
        assert time.monotonic() - killed_at < 9, "the dead worker was not noticed"
        time.sleep(0.1)
    assert "workers lost" in engine.scheduler.log()
    assert request.thread.is_alive(), "the request ended although its worker died"

    offset = len(engine.scheduler.log())
    replacement = worker_process(
        "worker-replacement", pipeline.model_dir, engine.plan_port, engine.result_port,
        "--num-blocks", str(NUM_BLOCKS), "--scheduler-timeout", "5",
    ).start()  # fmt: skip
    engine.workers.append(replacement)
    engine.scheduler.wait_for_log("worker rank 0 attached", timeout_s=60, after=offset)
    assert request.result() == expected_text
    assert request.usage.completion_tokens == MAX_TOKENS
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
    pipeline, expected_text, scheduler_args
):
    """Kill -9 the scheduler mid-generation and start it again under the same engine id: it
    re-reads its un-ACKed request, the waiting worker attaches to the new epoch, the request is
    recomputed and the client gets exactly the text it would have had."""
    engine = pipeline.engines[0]

    def start_scheduler(name: str):
        scheduler = scheduler_process(
            name, pipeline.redis_url, pipeline.namespace, ENGINE_ID, engine.plan_port,
            engine.result_port, "--worker-timeout", "5", "--max-num-batched-tokens", "512",
            *scheduler_args,
        ).start()  # fmt: skip
        engine.scheduler = scheduler
        return scheduler

    start_scheduler("scheduler-second").wait_for_log("workers ready", timeout_s=30)
    request = StreamingRequest(pipeline)
    engine.scheduler.kill()
    third = start_scheduler("scheduler-third")
    third.wait_for_log("resuming 1 un-ACKed request(s)", timeout_s=30)
    assert request.result() == expected_text
    assert request.usage.completion_tokens == MAX_TOKENS
