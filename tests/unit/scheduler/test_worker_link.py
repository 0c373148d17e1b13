"""The scheduler's worker link over real loopback sockets, with the test playing two worker
ranks: readiness, refusals, adopting the workers' block size, results (stale ones dropped),
losing a rank, and a long step that is not a loss while the rank heartbeats."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import zmq

from pagedserve.services.scheduler.engine_shape import EngineShape
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import Heartbeat, StepPlan, StepResult, WorkerHello
from pagedserve.shared.transport import PlanSubscriber, ResultPusher

ANY_PORT = "tcp://127.0.0.1:*"


def hello(
    rank: int, num_blocks: int = 50, block_size: int = 16, max_num_batched_tokens: int = 512
) -> WorkerHello:
    return WorkerHello(rank, 2, num_blocks, block_size, 512, "fake", 100 + rank,
                       max_num_batched_tokens)  # fmt: skip


class FakeRank:
    def __init__(self, context: zmq.Context, link: WorkerLink, rank: int) -> None:
        self.rank = rank
        self.subscriber = PlanSubscriber(context, link.plan_endpoint)
        self.pusher = ResultPusher(context, link.result_endpoint)

    async def scheduler_epoch(self, timeout_s: float = 5.0) -> str:
        """Wait for a scheduler heartbeat, as a worker does before saying hello."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.subscriber.recv(timeout_s=0)
            if isinstance(message, Heartbeat):
                assert message.role == "scheduler"
                return message.epoch
            await asyncio.sleep(0.02)
        raise AssertionError("no scheduler heartbeat")

    async def next_plan(self, timeout_s: float = 5.0) -> StepPlan:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.subscriber.recv(timeout_s=0)
            if isinstance(message, StepPlan):
                return message
            await asyncio.sleep(0.01)
        raise AssertionError("no plan")

    def beat(self) -> None:
        self.pusher.send(Heartbeat.from_worker(self.rank, -1))

    def close(self) -> None:
        self.subscriber.close()
        self.pusher.close()


async def until(condition, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def attach(link: WorkerLink, ranks: list[FakeRank]) -> None:
    """Every rank says hello once the scheduler's first heartbeat came: the link is ready."""
    await ranks[0].scheduler_epoch()
    for rank in ranks:
        rank.pusher.send(hello(rank.rank))
    assert await link.wait_ready(2.0)


async def with_link(
    scenario,
    worker_timeout_s: float = 10.0,
    block_size: int | None = 16,
) -> None:
    link = WorkerLink(ANY_PORT, ANY_PORT, world_size=2, block_size=block_size,
                      worker_timeout_s=worker_timeout_s)  # fmt: skip
    link.start()
    context = zmq.Context()
    ranks = [FakeRank(context, link, r) for r in range(2)]
    try:
        await scenario(link, ranks)
    finally:
        for rank in ranks:
            rank.close()
        context.term()
        await link.close()


def test_ready_once_every_rank_said_hello_with_the_smallest_cache():
    async def scenario(link, ranks):
        epoch = await ranks[0].scheduler_epoch()
        assert epoch == link.epoch
        ranks[0].pusher.send(hello(0, num_blocks=50))
        assert not await link.wait_ready(0.3)
        ranks[1].pusher.send(hello(1, block_size=32))  # refused: wrong block size
        assert not await link.wait_ready(0.3)
        ranks[1].pusher.send(hello(1, num_blocks=40))
        assert await link.wait_ready(2.0)
        shape = EngineShape.derive(link.hellos, SchedulerConfig(), CacheConfig())
        assert shape.num_blocks == 40 and shape.max_model_len == 512

    asyncio.run(with_link(scenario))


def test_without_a_block_size_the_first_hello_sets_it_for_good(
    caplog: pytest.LogCaptureFixture,
):
    async def scenario(link, ranks):
        await ranks[0].scheduler_epoch()
        assert link.block_size is None
        ranks[1].pusher.send(hello(1, block_size=8))
        await until(lambda: link.block_size is not None)
        assert link.block_size == 8
        ranks[0].pusher.send(hello(0, block_size=16))  # refused: not the adopted size
        assert not await link.wait_ready(0.3)
        ranks[0].pusher.send(hello(0, block_size=8))
        assert await link.wait_ready(2.0)
        link.new_epoch()  # as after a lost worker: the adopted size still holds
        ranks[0].pusher.send(hello(0, block_size=16))  # a restarted rank with another size
        ranks[1].pusher.send(hello(1, block_size=8))
        await until(lambda: len(link.hellos) == 1)
        assert not await link.wait_ready(0.3)
        assert [h.rank for h in link.hellos] == [1] and link.block_size == 8

    with caplog.at_level(logging.ERROR, logger="pagedserve.services.scheduler.worker_link"):
        asyncio.run(with_link(scenario, block_size=None))
    refusals = [
        r.getMessage() for r in caplog.records if "refusing worker rank 0" in r.getMessage()
    ]
    assert len(refusals) == 2
    assert all("block_size 16 != the scheduler's 8" in message for message in refusals)


def test_results_are_matched_to_their_step_and_stale_ones_dropped():
    async def scenario(link, ranks):
        await ranks[0].scheduler_epoch()
        await ranks[1].scheduler_epoch()
        for rank in ranks:
            rank.pusher.send(hello(rank.rank))
        assert await link.wait_ready(2.0)
        link.publish(StepPlan(8))
        for rank in ranks:
            assert (await rank.next_plan()).step_id == 8
        ranks[0].pusher.send(StepResult(7, ["old"], [1]))  # a step given up on earlier
        ranks[0].pusher.send(StepResult(8, ["a"], [5]))
        result = await link.wait_result(8, timeout_s=2.0)
        assert result.step_id == 8 and result.token_ids == [5]

    asyncio.run(with_link(scenario))


def test_two_plans_out_get_their_own_results_and_a_loss_answers_both():
    """Async scheduling publishes the next plan before the last result: each waiter gets its
    own step's result, whatever order they come in, and a lost rank fails every plan out."""

    async def scenario(link, ranks):
        await attach(link, ranks)
        link.publish(StepPlan(3))
        link.publish(StepPlan(4))
        ranks[0].pusher.send(StepResult(4, ["b"], [9]))
        ranks[0].pusher.send(StepResult(3, ["a"], [5]))
        assert (await link.wait_result(3, timeout_s=2.0)).token_ids == [5]
        assert (await link.wait_result(4, timeout_s=2.0)).token_ids == [9]
        link.publish(StepPlan(5))
        link.publish(StepPlan(6))
        assert await link.wait_result(5, timeout_s=0.3) is None  # no result in time: lost
        assert await link.wait_result(6, timeout_s=10.0) is None  # answered at once
        assert "no result for step 5" in link.lost_reason

    asyncio.run(with_link(scenario))


def test_a_silent_rank_is_lost_and_the_step_in_flight_fails():
    async def scenario(link, ranks):
        await attach(link, ranks)
        link.publish(StepPlan(1))
        waiting = asyncio.create_task(link.wait_result(1, timeout_s=10.0))
        for _ in range(15):  # rank 0 keeps beating, rank 1 is silent
            ranks[0].beat()
            await asyncio.sleep(0.1)
        assert await waiting is None
        assert "worker rank 1 sent nothing" in link.lost_reason
        assert not link.is_ready
        old_epoch = link.epoch
        link.new_epoch()
        assert link.epoch != old_epoch and link.lost_reason is None and link.hellos == []

    asyncio.run(with_link(scenario, worker_timeout_s=0.8))


def test_a_hello_while_ready_means_that_rank_lost_its_state():
    async def scenario(link, ranks):
        await attach(link, ranks)
        ranks[1].pusher.send(hello(1))  # restarted
        for _ in range(50):
            if not link.is_ready:
                break
            await asyncio.sleep(0.02)
        assert "worker rank 1 (pid 101) attached again" in link.lost_reason

    asyncio.run(with_link(scenario))


def test_no_result_in_time_is_a_loss():
    async def scenario(link, ranks):
        await attach(link, ranks)
        link.publish(StepPlan(2))
        assert await link.wait_result(2, timeout_s=0.3) is None
        assert "no result for step 2 within 0.3s" in link.lost_reason

    asyncio.run(with_link(scenario))


def test_a_step_longer_than_the_heartbeat_timeout_is_not_a_loss_while_ranks_heartbeat():
    async def scenario(link, ranks):
        await attach(link, ranks)
        link.publish(StepPlan(3))
        waiting = asyncio.create_task(link.wait_result(3, timeout_s=30.0))
        for _ in range(20):  # 2 s of computing, 4x the heartbeat timeout: both ranks beat
            for rank in ranks:
                rank.beat()
            await asyncio.sleep(0.1)
        assert not waiting.done() and link.is_ready and link.lost_reason is None
        ranks[0].pusher.send(StepResult(3, ["a"], [5]))
        result = await asyncio.wait_for(waiting, 5)
        assert result is not None and result.token_ids == [5]

    asyncio.run(with_link(scenario, worker_timeout_s=0.5))
