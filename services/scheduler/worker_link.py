"""The scheduler's side of the ZeroMQ link to its worker ranks: handshake, liveness, plans out,
results in.

An *epoch* is one view of the workers in which every rank has said hello and holds sequence
state that matches the scheduler's. The link heartbeats with its epoch as a field; a worker that
sees a new epoch drops its sequences and says hello (see `services/gpu_worker/worker_loop.py`).
The link is *ready* once every rank has said hello in the current epoch and is still
heartbeating.

A rank is *lost* when it has not heartbeated for `worker_timeout_s` (silence), when a step's
result does not come within the step's own timeout (`wait_result`), or when it says hello again
while ready (it restarted, or dropped its state after losing us). Liveness is not latency: a
worker's heartbeats flow from a thread while it computes, so a long step is not a loss until
the (much longer) step timeout. Losing a rank fails the step in flight (`wait_result` returns
None) and `lost_reason` says why; `worker_recovery.py` then preempts everything and calls
`new_epoch()`, and every rank starts again from empty state.

The block size is a memory layout: every hello must match it (the flag's, else the first
accepted hello's, for good). The engine's other dimensions are derived from the hellos once,
in `engine_shape.py`; `require(shape)` then refuses ranks that could not hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

import zmq

from pagedserve.services.scheduler.engine_shape import EngineShape
from pagedserve.shared.protocol import ROLE_WORKER, Heartbeat, StepPlan, StepResult, WorkerHello
from pagedserve.shared.tasks import cancel_and_wait, start_background
from pagedserve.shared.transport import LoopPlanPublisher, LoopResultPuller

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
HANDSHAKE_HEARTBEAT_INTERVAL_S = 0.2  # faster while waiting for hellos: quicker attach
LIVENESS_CHECK_S = 0.25  # how often silence is looked for


@dataclass(slots=True)
class RankState:
    last_seen: float = 0.0  # monotonic time of its last message
    hello: WorkerHello | None = None  # its hello in the current epoch


class WorkerLink:
    def __init__(
        self,
        plan_address: str,
        result_address: str,
        world_size: int,
        block_size: int | None,
        worker_timeout_s: float = 10.0,
    ) -> None:
        self.plan_address = plan_address
        self.result_address = result_address
        self.world_size = world_size
        # None until the first accepted hello: then the workers' (device-dependent) default,
        # which every later hello, in this epoch or any later one, must match
        self.block_size = block_size
        self.worker_timeout_s = worker_timeout_s
        self.epoch = uuid.uuid4().hex[:12]
        self.ranks = [RankState() for _ in range(world_size)]
        self.min_num_blocks = 0  # a rank holding fewer blocks than this is refused
        self.lost_reason: str | None = None
        self.last_step_id = -1
        self._ready = asyncio.Event()
        # per published plan whose result is awaited (two with async scheduling), in order
        self._result_waiters: dict[int, asyncio.Future[StepResult | None]] = {}
        self._context = zmq.Context()
        self._publisher: LoopPlanPublisher | None = None
        self._puller: LoopResultPuller | None = None
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind both sockets (raises TransportError if a port is taken) and start heartbeating."""
        self._publisher = LoopPlanPublisher(self._context, self.plan_address)
        self._puller = LoopResultPuller(self._context, self.result_address)
        self._puller.start_reading(self._on_message)
        self._tasks = [
            start_background(self._heartbeat_forever(), "scheduler-heartbeat"),
            start_background(self._watch_liveness_forever(), "worker-liveness"),
        ]

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        for socket in (self._publisher, self._puller):
            if socket is not None:
                socket.close()
        self._context.term()

    # -- state -----------------------------------------------------------------------------------

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    @property
    def plan_endpoint(self) -> str:
        """The bound plan address (a `tcp://host:*` wildcard resolved)."""
        assert self._publisher is not None, "start() first"
        return self._publisher.endpoint

    @property
    def result_endpoint(self) -> str:
        assert self._puller is not None, "start() first"
        return self._puller.endpoint

    @property
    def hellos(self) -> list[WorkerHello]:
        return [r.hello for r in self.ranks if r.hello is not None]

    def workers_alive(self) -> bool:
        now = time.monotonic()
        return all(now - r.last_seen <= self.worker_timeout_s for r in self.ranks)

    async def wait_ready(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        return self.is_ready

    def require(self, shape: EngineShape) -> None:
        """From now on, refuse a rank that cannot hold `shape` (the scheduler hands it out)."""
        self.block_size = shape.block_size
        self.min_num_blocks = shape.num_blocks

    def new_epoch(self) -> None:
        """Forget every hello; every rank must drop its state and say hello again."""
        self.epoch = uuid.uuid4().hex[:12]
        for rank in self.ranks:
            rank.hello = None
        self._ready.clear()
        self.lost_reason = None
        self._publish_heartbeat()
        logger.info("waiting for %d worker rank(s) in epoch %s", self.world_size, self.epoch)

    # -- steps -----------------------------------------------------------------------------------

    def publish(self, plan: StepPlan) -> None:
        assert self._publisher is not None, "start() first"
        self.last_step_id = plan.step_id
        self._result_waiters[plan.step_id] = asyncio.get_running_loop().create_future()
        self._publisher.send(plan)

    async def wait_result(self, step_id: int, timeout_s: float) -> StepResult | None:
        """Rank 0's result for a published plan, or None if a rank was lost or no result came
        within `timeout_s` (then `lost_reason` says which). A lost rank answers every plan
        still awaited with None."""
        future = self._result_waiters[step_id]
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            self._lose(f"no result for step {step_id} within {timeout_s:.1f}s")
            return None
        finally:
            del self._result_waiters[step_id]

    # -- background tasks ------------------------------------------------------------------------

    def _publish_heartbeat(self) -> None:
        if self._publisher is not None:
            self._publisher.send(Heartbeat.from_scheduler(self.epoch, self.last_step_id))

    async def _heartbeat_forever(self) -> None:
        while True:
            self._publish_heartbeat()
            ready = self.is_ready
            await asyncio.sleep(HEARTBEAT_INTERVAL_S if ready else HANDSHAKE_HEARTBEAT_INTERVAL_S)

    async def _watch_liveness_forever(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_CHECK_S)
            self._check_liveness()

    def _on_message(self, message: object) -> None:
        if isinstance(message, StepResult):
            self._on_result(message)
        elif isinstance(message, Heartbeat):
            if message.role == ROLE_WORKER and 0 <= message.rank < self.world_size:
                self.ranks[message.rank].last_seen = time.monotonic()
        elif isinstance(message, WorkerHello):
            self._on_hello(message)
        else:
            logger.warning("ignoring %s from a worker", type(message).__name__)

    def _on_result(self, result: StepResult) -> None:
        self.ranks[0].last_seen = time.monotonic()
        waiter = self._result_waiters.get(result.step_id)
        if waiter is None or waiter.done():
            logger.debug("dropping stale result of step %d", result.step_id)
            return
        waiter.set_result(result)

    def _on_hello(self, hello: WorkerHello) -> None:
        problem = self._hello_problem(hello)
        if problem is not None:
            logger.error("refusing worker rank %d (pid %d): %s", hello.rank, hello.pid, problem)
            return
        state = self.ranks[hello.rank]
        state.last_seen = time.monotonic()
        if self.is_ready:
            self._lose(f"worker rank {hello.rank} (pid {hello.pid}) attached again: it lost state")
            return
        if self.block_size is None:
            self.block_size = hello.block_size
            logger.info("block_size %d: adopted from worker rank %d", hello.block_size, hello.rank)
        state.hello = hello
        logger.info(
            "worker rank %d attached (pid %d, %d blocks)", hello.rank, hello.pid, hello.num_blocks
        )
        if all(r.hello is not None for r in self.ranks):
            self._ready.set()

    def _hello_problem(self, hello: WorkerHello) -> str | None:
        if hello.world_size != self.world_size or not 0 <= hello.rank < self.world_size:
            return (
                f"it is rank {hello.rank} of {hello.world_size}, this engine has "
                f"tensor_parallel_size={self.world_size}"
            )
        if self.block_size is not None and hello.block_size != self.block_size:
            return f"block_size {hello.block_size} != the scheduler's {self.block_size}"
        if hello.num_blocks < self.min_num_blocks:
            return (
                f"it holds {hello.num_blocks} KV blocks, fewer than the {self.min_num_blocks} "
                "this scheduler already hands out"
            )
        return None

    def _check_liveness(self) -> None:
        if not self.is_ready:
            return
        now = time.monotonic()
        for rank, state in enumerate(self.ranks):
            silent_s = now - state.last_seen
            if silent_s > self.worker_timeout_s:
                self._lose(
                    f"worker rank {rank} sent nothing for {silent_s:.1f}s "
                    f"(timeout {self.worker_timeout_s:.1f}s)"
                )
                return

    def _lose(self, reason: str) -> None:
        if self.lost_reason is None:
            logger.error("worker lost: %s", reason)
            self.lost_reason = reason
        self._ready.clear()
        for waiter in self._result_waiters.values():
            if not waiter.done():
                waiter.set_result(None)
