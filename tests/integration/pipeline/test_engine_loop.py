"""The scheduler process's loop in-process against a real Redis, with the real worker loop
driving a fake model (no torch): Redis semantics of requests, outputs, ACKs, statuses,
rejections, aborts, restarts and a Redis outage, each in a second or two."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import replace

import pytest
import redis

from pagedserve.services.gpu_worker.worker_loop import WorkerLoop
from pagedserve.services.scheduler.engine_loop import EngineLoop, EngineLoopConfig
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import (
    ERROR_ENGINE,
    ERROR_INVALID_REQUEST,
    ERROR_QUEUE_FULL,
    AbortRequest,
    GenerateRequest,
    SamplingParams,
    StepPlan,
    StepResult,
    TokenDelta,
    decode,
    encode,
)
from pagedserve.shared.status import EngineStatus, from_fields
from tests.integration.conftest import RedisServer, free_port

pytestmark = pytest.mark.integration

GATEWAY = "gw-test"
TOKEN = 7
POISON = 666  # a prompt holding this token makes the fake model raise


class FakeModel:
    """Samples TOKEN for every sequence whose step reaches its last known token."""

    num_blocks = 64
    block_size = 16
    max_model_len = 128
    max_num_batched_tokens = 2048
    vocab_size = 1000
    num_speculative_tokens = 0  # no drafts by default (a device that has none)
    sliding_windows = (None,)  # one full-attention layer

    def __init__(self, step_delay_s: float = 0.0, first_step_delay_s: float = 0.0) -> None:
        self.step_delay_s = step_delay_s
        self.first_step_delay_s = first_step_delay_s  # one slow step (a big prefill, a compile)
        self.seqs: dict[str, int] = {}  # seq id -> number of known tokens
        self.failed: set[str] = set()  # dropped by a failed step, as the model runner does

    def drop_all(self) -> None:
        self.seqs.clear()
        self.failed.clear()

    def forget_failed(self, plan: StepPlan) -> None:
        for seq in (*plan.new_seqs, *plan.cached_seqs):
            self.seqs.pop(seq.seq_id, None)
            self.failed.add(seq.seq_id)

    def execute(self, plan: StepPlan) -> StepResult:
        delay = self.step_delay_s + self.first_step_delay_s
        time.sleep(delay)
        self.first_step_delay_s = 0.0
        for seq_id in (*plan.finished_seq_ids, *plan.preempted_seq_ids):
            self.seqs.pop(seq_id, None)
            self.failed.discard(seq_id)
        sampled = []
        for new in plan.new_seqs:
            if POISON in new.token_ids:
                raise RuntimeError("poisoned prompt")
            self.failed.discard(new.seq_id)
            self.seqs[new.seq_id] = len(new.token_ids)
            if new.num_computed_tokens + new.num_scheduled_tokens == len(new.token_ids):
                sampled.append(new)
        for cached in plan.cached_seqs:
            if cached.seq_id in self.failed:
                continue
            self.seqs[cached.seq_id] += len(cached.new_token_ids)
            end = cached.num_computed_tokens + cached.num_scheduled_tokens
            assert end <= self.seqs[cached.seq_id], f"{cached.seq_id}: a token it does not hold"
            if end == self.seqs[cached.seq_id]:
                sampled.append(cached)
        for seq in sampled:
            self.seqs[seq.seq_id] += seq.keep_sample  # async scheduling: it holds its sample
        return StepResult(plan.step_id, [s.seq_id for s in sampled], [TOKEN] * len(sampled),
                          execute_time_s=delay)  # fmt: skip


class EngineHarness:
    """An EngineLoop in its own thread (own event loop) and a WorkerLoop in another."""

    def __init__(self, redis_url: str, namespace: str, engine_id: str = "e1",
                 step_delay_s: float = 0.0, max_waiting: int = 4096,
                 worker_timeout_s: float = 5.0, model: FakeModel | None = None,
                 async_scheduling: bool = False) -> None:  # fmt: skip
        plan_port, result_port = free_port(), free_port()
        self.engine = EngineLoop(
            EngineLoopConfig(
                engine_id=engine_id, redis_url=redis_url, namespace=namespace,
                plan_address=f"tcp://127.0.0.1:{plan_port}",
                result_address=f"tcp://127.0.0.1:{result_port}",
                scheduler_config=SchedulerConfig(max_model_len=128, max_waiting=max_waiting,
                                                 async_scheduling=async_scheduling),
                cache_config=CacheConfig(block_size=16), worker_timeout_s=worker_timeout_s,
                gateway_check_interval_s=0.5,
            )
        )  # fmt: skip
        self.worker = WorkerLoop(
            model or FakeModel(step_delay_s), 0, 1, f"tcp://127.0.0.1:{plan_port}",
            f"tcp://127.0.0.1:{result_port}", "fake",
        )  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = [
            threading.Thread(target=self._run_engine, daemon=True),
            threading.Thread(target=self.worker.run, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _run_engine(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await self.engine.run()

        asyncio.run(main())

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.engine.serving is None:
            assert time.monotonic() < deadline, "the engine never attached its worker"
            time.sleep(0.02)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.engine.request_stop)
        self._threads[0].join(timeout=15)
        self.worker.stop_event.set()
        self._threads[1].join(timeout=5)
        assert not any(t.is_alive() for t in self._threads)


class Client:
    """What a gateway does in Redis, by hand."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self.redis = redis.Redis.from_url(redis_url)
        self.keys = RedisKeys(namespace)
        self.redis.set(self.keys.gateway(GATEWAY), "1", ex=60)
        self.cursor = "0-0"
        self.deltas: dict[str, list[TokenDelta]] = {}

    def submit(self, request_id: str, max_tokens: int = 4, gateway_id: str = GATEWAY,
               prompt_len: int = 5, poison: bool = False) -> GenerateRequest:  # fmt: skip
        request = GenerateRequest(
            request_id, [POISON] * poison + list(range(3, 3 + prompt_len)),
            SamplingParams(temperature=0.0, max_tokens=max_tokens), gateway_id=gateway_id,
        )  # fmt: skip
        self.redis.xadd(self.keys.requests, {"m": encode(request)})
        return request

    def abort(self, request_id: str) -> None:
        self.redis.xadd(self.keys.aborts, {"m": encode(AbortRequest([request_id], "test"))})

    def finished(self, request_ids: list[str], timeout_s: float = 10.0) -> dict[str, TokenDelta]:
        deadline = time.monotonic() + timeout_s
        while True:
            done = {r: d[-1] for r, d in self.deltas.items() if d and d[-1].finished}
            if all(r in done for r in request_ids):
                return done
            assert time.monotonic() < deadline, f"unfinished: {set(request_ids) - set(done)}"
            answer = self.redis.xread({self.keys.output(GATEWAY): self.cursor}, block=100)
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    self.cursor = entry_id
                    for delta in decode(fields[b"m"]).deltas:
                        self.deltas.setdefault(delta.request_id, []).append(delta)

    def status(self, request_id: str) -> dict[str, str]:
        fields = self.redis.hgetall(self.keys.request(request_id))
        return {k.decode(): v.decode() for k, v in fields.items()}


@pytest.fixture
def namespace() -> str:
    return f"loop-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=[False, True], ids=["sync", "async-scheduling"])
def engine(redis_url, namespace, request):
    harness = EngineHarness(redis_url, namespace, async_scheduling=request.param)
    harness.wait_ready()
    yield harness
    harness.stop()


def test_requests_complete_with_acks_and_status_timelines(engine, redis_url, namespace):
    client = Client(redis_url, namespace)
    for i in range(5):
        client.submit(f"r{i}", max_tokens=4)
    done = client.finished([f"r{i}" for i in range(5)])
    for i in range(5):
        tokens = [t for d in client.deltas[f"r{i}"] for t in d.token_ids]
        assert tokens == [TOKEN] * 4 and done[f"r{i}"].finish_reason == "length"
        status = client.status(f"r{i}")
        assert status["state"] == "finished" and status["engine_id"] == "e1"
        assert status["num_output_tokens"] == "4" and status["num_prompt_tokens"] == "5"
        times = [float(status[k]) for k in ("scheduled_at", "first_token_at", "finished_at")]
        assert times == sorted(times) and times[0] > 0
    assert client.redis.xlen(client.keys.requests) == 0  # ACKed and deleted
    assert client.redis.xpending(client.keys.requests, ENGINE_GROUP)["pending"] == 0


def test_an_impossible_request_is_answered_with_invalid_request_and_acked(
    engine, redis_url, namespace
):
    client = Client(redis_url, namespace)
    client.submit("too-long", max_tokens=200)  # 5 + 200 > max_model_len 128
    client.submit("fine", max_tokens=2)
    done = client.finished(["too-long", "fine"])
    rejected = done["too-long"]
    assert rejected.finish_reason == "error" and rejected.error_code == ERROR_INVALID_REQUEST
    assert "128" in rejected.error
    assert client.status("too-long")["state"] == "failed"
    assert done["fine"].finish_reason == "length"
    assert client.redis.xlen(client.keys.requests) == 0


def test_a_failing_step_fails_its_requests_with_an_engine_error_and_serving_goes_on(
    engine, redis_url, namespace
):
    client = Client(redis_url, namespace)
    client.submit("bad", max_tokens=3, poison=True)
    done = client.finished(["bad"])
    assert done["bad"].finish_reason == "error" and done["bad"].error_code == ERROR_ENGINE
    assert "RuntimeError: poisoned prompt" in done["bad"].error
    assert client.status("bad")["state"] == "failed"
    client.submit("good", max_tokens=3)
    assert client.finished(["good"])["good"].finish_reason == "length"


def test_an_abort_that_overtakes_its_request_still_aborts_it(engine, redis_url, namespace):
    client = Client(redis_url, namespace)
    client.abort("early")
    time.sleep(0.3)  # the engine reads the abort before the request exists
    client.submit("early", max_tokens=50)
    done = client.finished(["early"])
    assert done["early"].finish_reason == "abort"
    assert all(not d.token_ids for d in client.deltas["early"])


def test_a_restart_with_the_same_engine_id_resumes_unacked_requests(redis_url, namespace):
    client = Client(redis_url, namespace)
    keys = client.keys
    client.redis.xgroup_create(keys.requests, ENGINE_GROUP, id="0", mkstream=True)
    for i in range(3):
        client.submit(f"p{i}", max_tokens=3)
    # A previous life of engine "e1" took them and died before finishing any.
    taken = client.redis.xreadgroup(ENGINE_GROUP, "e1", {keys.requests: ">"}, count=10)
    assert len(taken[0][1]) == 3
    harness = EngineHarness(redis_url, namespace, engine_id="e1")
    try:
        done = client.finished(["p0", "p1", "p2"])
        assert all(d.finish_reason == "length" for d in done.values())
        assert client.redis.xlen(keys.requests) == 0
    finally:
        harness.stop()


def test_resumed_requests_beyond_the_waiting_bound_get_a_retryable_queue_full(redis_url, namespace):
    client = Client(redis_url, namespace)
    keys = client.keys
    client.redis.xgroup_create(keys.requests, ENGINE_GROUP, id="0", mkstream=True)
    for i in range(3):
        client.submit(f"q{i}", max_tokens=2)
    client.redis.xreadgroup(ENGINE_GROUP, "e1", {keys.requests: ">"}, count=10)
    harness = EngineHarness(redis_url, namespace, engine_id="e1", max_waiting=1)
    try:
        done = client.finished(["q0", "q1", "q2"])
    finally:
        harness.stop()
    assert done["q0"].finish_reason == "length"
    for request_id in ("q1", "q2"):
        assert done[request_id].finish_reason == "error"
        assert done[request_id].error_code == ERROR_QUEUE_FULL
    assert client.redis.xlen(keys.requests) == 0


def test_requests_of_a_dead_gateway_are_aborted(redis_url, namespace):
    harness = EngineHarness(redis_url, namespace, step_delay_s=0.02)
    try:
        harness.wait_ready()
        client = Client(redis_url, namespace)
        client.submit("orphan", max_tokens=120, gateway_id="gw-dead", prompt_len=2)
        deadline = time.monotonic() + 10
        while client.status("orphan").get("state") != "aborted":
            assert time.monotonic() < deadline, client.status("orphan")
            time.sleep(0.1)
        assert int(client.status("orphan")["num_output_tokens"]) < 120
        assert client.redis.xlen(client.keys.requests) == 0
    finally:
        harness.stop()


@pytest.mark.slow
def test_the_engine_rides_out_a_redis_restart():
    server = RedisServer()
    server.start()
    namespace = "outage"
    harness = EngineHarness(server.url, namespace)
    try:
        harness.wait_ready()
        client = Client(server.url, namespace)
        client.submit("before", max_tokens=2)
        client.finished(["before"])
        server.stop()
        time.sleep(1.5)  # the engine sees connection errors and backs off
        port = server.port
        server = RedisServer()
        server.port = port
        server.start()  # empty: the consumer group is gone too
        client = Client(server.url, namespace)
        deadline = time.monotonic() + 15
        client.submit("after", max_tokens=2)
        client.finished(["after"], timeout_s=deadline - time.monotonic())
    finally:
        harness.stop()
        server.stop()


def test_a_step_longer_than_the_heartbeat_timeout_completes_without_recovery(redis_url, namespace):
    # The worker heartbeats every second from its own thread while the 4 s step computes;
    # only silence (2.5 s without any message) would make it lost.
    harness = EngineHarness(
        redis_url, namespace, worker_timeout_s=2.5, model=FakeModel(first_step_delay_s=4.0)
    )
    try:
        harness.wait_ready()
        client = Client(redis_url, namespace)
        client.submit("slow", max_tokens=3)
        done = client.finished(["slow"], timeout_s=30)
        assert done["slow"].finish_reason == "length"
        assert [t for d in client.deltas["slow"] for t in d.token_ids] == [TOKEN] * 3
        serving = harness.engine.serving
        assert serving is not None and serving.scheduler.stats().num_preemptions == 0
        assert harness.engine.link.lost_reason is None and harness.engine.link.is_ready
    finally:
        harness.stop()


class RecordingModel(FakeModel):
    """Records each plan's new sequences, and says when a step starts computing."""

    def __init__(self, first_step_delay_s: float) -> None:
        super().__init__(first_step_delay_s=first_step_delay_s)
        self.new_seqs_by_plan: list[list[str]] = []
        self.computing = threading.Event()

    def execute(self, plan: StepPlan) -> StepResult:
        self.new_seqs_by_plan.append([s.seq_id for s in plan.new_seqs])
        self.computing.set()
        return super().execute(plan)


def test_a_request_that_arrives_while_a_step_computes_is_in_the_next_plan(redis_url, namespace):
    """New requests are read just before planning, not while a step computes: "late" arrives
    during the first (5 s) step, a second into it (after whatever the engine did as the step
    began), and is admitted by the plan right after it."""
    model = RecordingModel(first_step_delay_s=5.0)
    harness = EngineHarness(redis_url, namespace, model=model)
    try:
        harness.wait_ready()
        client = Client(redis_url, namespace)
        client.submit("early", max_tokens=4)
        assert model.computing.wait(timeout=10)
        time.sleep(1.0)  # into the step: not a wait for speed, the step lasts 5 s
        client.submit("late", max_tokens=2)
        client.finished(["early", "late"], timeout_s=30)
        assert model.new_seqs_by_plan[:2] == [["early"], ["late"]]
    finally:
        harness.stop()


def test_a_malformed_request_is_answered_and_acked_and_its_batch_mates_are_served(
    engine, redis_url, namespace
):
    client = Client(redis_url, namespace)
    good = client.submit("good", max_tokens=3)
    bad_prompt = replace(good, request_id="bad-token", prompt_token_ids=[3, 4, 5000])
    bad_sampling = replace(
        good, request_id="bad-temp", sampling=replace(good.sampling, temperature=float("nan"))
    )
    for request in (bad_prompt, bad_sampling):
        client.redis.xadd(client.keys.requests, {"m": encode(request)})
    client.redis.xadd(client.keys.requests, {"m": b"not msgpack"})  # nobody to answer: ACKed
    done = client.finished(["good", "bad-token", "bad-temp"])
    assert done["good"].finish_reason == "length"
    assert done["bad-token"].error_code == ERROR_INVALID_REQUEST
    assert "[5000] are outside the vocabulary [0, 1000)" in done["bad-token"].error
    assert done["bad-temp"].error_code == ERROR_INVALID_REQUEST
    assert "temperature must be a finite number" in done["bad-temp"].error
    deadline = time.monotonic() + 10
    while client.redis.xlen(client.keys.requests):  # every entry ACKed and deleted
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.submit("after", max_tokens=2)
    assert client.finished(["after"])["after"].finish_reason == "length"


def test_the_engine_status_is_current_when_a_request_finishes(engine, redis_url, namespace):
    """The gauges are written with the step's deltas: when the gateway reads a request's
    last delta, the engine status already counts it as finished (was up to 1 s stale)."""
    client = Client(redis_url, namespace)
    for round_ in range(3):
        client.submit(f"s{round_}", max_tokens=2)
        client.finished([f"s{round_}"])
        fields = client.redis.hgetall(client.keys.engine("e1"))
        status = from_fields(EngineStatus, fields)
        assert status.num_running == 0 and status.num_waiting == 0, status
        assert status.num_free_blocks == status.num_total_blocks == FakeModel.num_blocks
        assert status.num_finished == round_ + 1


def test_the_engine_status_says_where_the_steps_spent_their_time(redis_url, namespace):
    """Worker execute time (as the worker reports it) within the plan-to-result time, and the
    scheduler's own time between steps, as totals in the status record."""
    harness = EngineHarness(redis_url, namespace, step_delay_s=0.05)
    try:
        harness.wait_ready()
        client = Client(redis_url, namespace)
        client.submit("timed", max_tokens=4)
        client.finished(["timed"])
        status = from_fields(EngineStatus, client.redis.hgetall(client.keys.engine("e1")))
        assert status.num_steps >= 4
        assert status.worker_execute_s == pytest.approx(0.05 * status.num_steps)
        assert status.step_in_flight_s >= status.worker_execute_s
        assert status.scheduling_s > 0
    finally:
        harness.stop()
