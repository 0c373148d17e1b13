"""The typed ZeroMQ wrappers over real loopback sockets (wildcard ports, so no clashes)."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq

from pagedserve.shared.protocol import (
    CachedSequence,
    Heartbeat,
    NewSequence,
    SamplingParams,
    StepPlan,
    StepResult,
    WorkerHello,
)
from pagedserve.shared.transport import (
    LoopPlanPublisher,
    LoopResultPuller,
    PlanPublisher,
    PlanSubscriber,
    ResultPuller,
    ResultPusher,
    TransportError,
)

ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def make_plan(step_id: int) -> StepPlan:
    return StepPlan(
        step_id=step_id,
        new_seqs=[
            NewSequence("a", [1, 2, 3], 3, 0, 3, [0], SamplingParams(temperature=0.0)),
        ],
        cached_seqs=[CachedSequence("b", [7], [4], 9, 1)],
        finished_seq_ids=["c"],
    )


def subscribe_until_joined(
    publisher: PlanPublisher, subscriber: PlanSubscriber, timeout_s: float = 5.0
) -> None:
    """The slow-joiner handshake in miniature: publish heartbeats until one arrives."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        publisher.send(Heartbeat("scheduler:e1", time.time()))
        if isinstance(subscriber.recv(timeout_s=0.05), Heartbeat):
            return
    raise AssertionError("subscriber never joined")


def test_plans_arrive_in_order_and_decode_to_the_same_messages(context):
    with (
        PlanPublisher(context, ANY_PORT) as publisher,
        PlanSubscriber(context, publisher.endpoint) as subscriber,
    ):
        subscribe_until_joined(publisher, subscriber)
        while subscriber.recv(timeout_s=0.05) is not None:  # drain extra heartbeats
            pass
        plans = [make_plan(i) for i in range(200)]
        for plan in plans:
            publisher.send(plan)
        received = [subscriber.recv(timeout_s=2.0) for _ in plans]
    assert received == plans


def test_every_subscriber_gets_every_plan(context):
    with PlanPublisher(context, ANY_PORT) as publisher:
        subscribers = [PlanSubscriber(context, publisher.endpoint) for _ in range(2)]
        try:
            for subscriber in subscribers:
                subscribe_until_joined(publisher, subscriber)
            for subscriber in subscribers:
                while subscriber.recv(timeout_s=0.05) is not None:
                    pass
            publisher.send(make_plan(7))
            for subscriber in subscribers:
                assert subscriber.recv(timeout_s=2.0) == make_plan(7)
        finally:
            for subscriber in subscribers:
                subscriber.close()


def test_a_large_burst_is_not_dropped_by_a_high_water_mark(context):
    """SNDHWM 0 / RCVHWM 0: 5,000 plans (above ZeroMQ's default HWM of 1,000) all arrive."""
    with (
        PlanPublisher(context, ANY_PORT) as publisher,
        PlanSubscriber(context, publisher.endpoint) as subscriber,
    ):
        subscribe_until_joined(publisher, subscriber)
        while subscriber.recv(timeout_s=0.05) is not None:
            pass
        for step_id in range(5000):
            publisher.send(StepPlan(step_id=step_id))
        step_ids = []
        while (message := subscriber.recv(timeout_s=1.0)) is not None:
            step_ids.append(message.step_id)
    assert step_ids == list(range(5000))


def test_results_flow_from_pushers_to_the_puller(context):
    with ResultPuller(context, ANY_PORT) as puller:
        pushers = [ResultPusher(context, puller.endpoint) for _ in range(2)]
        try:
            pushers[0].send(WorkerHello(0, 2, 100, 16, 256, "tiny", 11))
            pushers[1].send(WorkerHello(1, 2, 90, 16, 256, "tiny", 12))
            pushers[0].send(StepResult(3, ["a"], [42], logprobs=[-0.5]))
            received = [puller.recv(timeout_s=2.0) for _ in range(3)]
        finally:
            for pusher in pushers:
                pusher.close()
    hellos = sorted((m for m in received if isinstance(m, WorkerHello)), key=lambda m: m.rank)
    assert [h.num_blocks for h in hellos] == [100, 90]
    assert StepResult(3, ["a"], [42], logprobs=[-0.5]) in received


def test_recv_times_out_with_none(context):
    with ResultPuller(context, ANY_PORT) as puller:
        start = time.monotonic()
        assert puller.recv(timeout_s=0.1) is None
        assert 0.05 < time.monotonic() - start < 1.0


def test_garbage_is_a_transport_error_not_an_object(context):
    with ResultPuller(context, ANY_PORT) as puller:
        raw = context.socket(zmq.PUSH)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(puller.endpoint)
        try:
            raw.send(b"\xc1 not msgpack")
            with pytest.raises(TransportError, match="undecodable"):
                puller.recv(timeout_s=2.0)
        finally:
            raw.close()


def test_binding_a_taken_port_names_the_address(context):
    with (
        ResultPuller(context, ANY_PORT) as puller,
        pytest.raises(TransportError, match=r"cannot bind tcp://127\.0\.0\.1:\d+"),
    ):
        ResultPuller(context, puller.endpoint)


def test_loop_publisher_and_puller() -> None:
    """Messages reach the handler from the loop's reader callback, in order, including those
    queued before reading started; an undecodable frame or a failing handler is skipped
    without stranding the messages behind it (the descriptor does not signal them again)."""

    async def scenario() -> tuple[list[object], object]:
        ctx = zmq.Context()
        publisher = LoopPlanPublisher(ctx, ANY_PORT)
        puller = LoopResultPuller(ctx, ANY_PORT)
        subscriber = PlanSubscriber(ctx, publisher.endpoint)
        pusher = ResultPusher(ctx, puller.endpoint)
        received: list[object] = []
        done = asyncio.get_running_loop().create_future()

        def on_message(message: object) -> None:
            if message == Heartbeat("worker:0", 2.0):
                raise RuntimeError("a handler's bug")
            received.append(message)
            if len(received) == 3:
                done.set_result(None)

        try:
            pusher.send(Heartbeat("worker:0", 1.0))  # queued before reading starts
            await asyncio.sleep(0.1)
            puller.start_reading(on_message)
            pusher.socket.send(b"not msgpack")
            pusher.send(Heartbeat("worker:0", 2.0))
            for step in (3, 4):
                pusher.send(make_plan(step))
            await asyncio.wait_for(done, 10.0)
            plan = None
            for _ in range(100):
                publisher.send(make_plan(1))
                plan = subscriber.recv(timeout_s=0.02)
                if plan is not None:
                    break
            return received, plan
        finally:
            for socket in (publisher, puller, subscriber, pusher):
                socket.close()
            ctx.term()

    received, plan = asyncio.run(scenario())
    assert received == [Heartbeat("worker:0", 1.0), make_plan(3), make_plan(4)]
    assert plan == make_plan(1)
