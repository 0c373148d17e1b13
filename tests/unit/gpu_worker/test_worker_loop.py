"""The worker's process loop against a fake runner, over real loopback ZeroMQ sockets: the
handshake, execute -> result, errors as results, epochs, scheduler loss and Shutdown."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from pagedserve.services.gpu_worker.worker_loop import WorkerLoop
from pagedserve.shared.protocol import (
    Heartbeat,
    NewSequence,
    SamplingParams,
    Shutdown,
    StepPlan,
    StepResult,
    WorkerHello,
)
from pagedserve.shared.transport import PlanPublisher, ResultPuller

ANY_PORT = "tcp://127.0.0.1:*"


class FakeRunner:
    num_blocks = 10
    block_size = 16
    max_model_len = 128
    max_num_batched_tokens = 512
    vocab_size = 1000
    num_speculative_tokens = 3

    def __init__(self) -> None:
        self.seqs: dict[str, NewSequence] = {}
        self.sliding_windows: list[int | None] = [None, 64]  # per layer, for the hello

    def drop_all(self) -> None:
        self.seqs.clear()

    def forget_failed(self, plan: StepPlan) -> None:
        for seq in (*plan.new_seqs, *plan.cached_seqs):
            self.seqs.pop(seq.seq_id, None)

    def execute(self, plan: StepPlan) -> StepResult:
        for seq_id in (*plan.finished_seq_ids, *plan.preempted_seq_ids):
            self.seqs.pop(seq_id, None)
        for seq in plan.new_seqs:
            if seq.seq_id == "boom":
                raise RuntimeError("bad block table")
            self.seqs[seq.seq_id] = seq
        seq_ids = [s.seq_id for s in plan.new_seqs]
        return StepResult(plan.step_id, seq_ids, [7] * len(seq_ids))


def new_seq(seq_id: str) -> NewSequence:
    return NewSequence(seq_id, [1, 2], 2, 0, 2, [0], SamplingParams())


class Harness:
    def __init__(self, scheduler_timeout_s: float = 10.0) -> None:
        self.context = zmq.Context()
        self.publisher = PlanPublisher(self.context, ANY_PORT)
        self.puller = ResultPuller(self.context, ANY_PORT)
        self.runner = FakeRunner()
        self.loop = WorkerLoop(
            self.runner, 0, 1, self.publisher.endpoint, self.puller.endpoint, "fake",
            scheduler_timeout_s=scheduler_timeout_s,
        )  # fmt: skip
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()

    def next_of(self, kind: type, timeout_s: float = 5.0, heartbeat_epoch: str | None = None):
        """The next message of `kind` from the worker, heartbeating as the scheduler of
        `heartbeat_epoch` meanwhile if given."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if heartbeat_epoch is not None:
                self.publisher.send(Heartbeat.from_scheduler(heartbeat_epoch, -1))
            message = self.puller.recv(timeout_s=0.05)
            if isinstance(message, kind):
                return message
        raise AssertionError(f"no {kind.__name__} within {timeout_s}s")

    def no_message_of(self, kind: type, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if isinstance(self.puller.recv(timeout_s=0.05), kind):
                return False
        return True

    def close(self) -> None:
        self.loop.stop_event.set()
        self.thread.join(timeout=5)
        self.publisher.close()
        self.puller.close()
        self.context.term()


@pytest.fixture
def harness():
    h = Harness()
    yield h
    h.close()


def test_heartbeats_flow_but_no_hello_before_a_scheduler_heartbeat(harness):
    heartbeat = harness.next_of(Heartbeat)
    assert (heartbeat.role, heartbeat.rank) == ("worker", 0)
    assert harness.no_message_of(WorkerHello, within_s=0.3)


def test_hello_then_plans_execute_and_results_come_back(harness):
    hello = harness.next_of(WorkerHello, heartbeat_epoch="e1")
    assert (hello.rank, hello.world_size, hello.num_blocks, hello.block_size) == (0, 1, 10, 16)
    assert hello.max_num_batched_tokens == 512  # the runner's: the scheduler may adopt it
    assert hello.num_speculative_tokens == 3  # its device default: the scheduler may adopt it
    assert hello.sliding_windows == [None, 64]  # each layer's KV-cache spec
    harness.publisher.send(StepPlan(3, new_seqs=[new_seq("a")]))
    result = harness.next_of(StepResult)
    assert (result.step_id, result.seq_ids, result.token_ids, result.error) == (3, ["a"], [7], None)


def test_an_exception_in_execute_becomes_an_error_result_and_the_loop_goes_on(harness):
    harness.next_of(WorkerHello, heartbeat_epoch="e1")
    harness.publisher.send(StepPlan(4, new_seqs=[new_seq("boom")]))
    failed = harness.next_of(StepResult)
    assert failed.step_id == 4 and "RuntimeError: bad block table" in failed.error
    harness.publisher.send(StepPlan(5, new_seqs=[new_seq("b")]))
    assert harness.next_of(StepResult).seq_ids == ["b"]


def test_a_new_epoch_drops_sequences_and_says_hello_again(harness):
    harness.next_of(WorkerHello, heartbeat_epoch="e1")
    harness.publisher.send(StepPlan(1, new_seqs=[new_seq("a")]))
    harness.next_of(StepResult)
    assert set(harness.runner.seqs) == {"a"}
    harness.next_of(WorkerHello, heartbeat_epoch="e2")
    assert harness.runner.seqs == {}


def test_plans_before_hello_are_ignored(harness):
    harness.next_of(Heartbeat)  # the worker's sockets are connected...
    time.sleep(0.2)  # ...and its subscription has reached the publisher
    harness.publisher.send(StepPlan(1, new_seqs=[new_seq("a")]))
    assert harness.no_message_of(StepResult, within_s=0.3)
    assert harness.runner.seqs == {}


def test_scheduler_silence_drops_state_and_the_worker_attaches_again():
    h = Harness(scheduler_timeout_s=0.5)
    try:
        h.next_of(WorkerHello, heartbeat_epoch="e1")
        h.publisher.send(StepPlan(1, new_seqs=[new_seq("a")]))
        h.next_of(StepResult)
        time.sleep(1.2)  # no scheduler heartbeats
        assert h.runner.seqs == {}
        assert h.next_of(WorkerHello, heartbeat_epoch="e1").rank == 0  # same epoch, again
    finally:
        h.close()


def test_shutdown_ends_the_loop(harness):
    harness.next_of(WorkerHello, heartbeat_epoch="e1")
    harness.publisher.send(Shutdown("test"))
    harness.thread.join(timeout=5)
    assert not harness.thread.is_alive()
