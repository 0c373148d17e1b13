"""The worker's process loop: handshake with the scheduler, then plan -> execute -> result.

States and transitions (one rank; every rank runs the same loop on the same plan stream):

    unattached --scheduler heartbeat of epoch E--> drop sequence state, say hello, attached(E)
    attached(E) --heartbeat of another epoch E'--> drop state, say hello, attached(E')
    attached(E) --no scheduler heartbeat for scheduler_timeout_s--> drop state, unattached
    any --Shutdown--> exit

The scheduler heartbeats with its epoch as a field (`Heartbeat.epoch`). An epoch is one scheduler
incarnation's view of its workers: a restarted scheduler, or one that lost a rank and wants every
rank to start from empty state, starts a new epoch, and every worker drops its sequences and
says hello again. Plans that arrive while unattached were meant for ranks that said hello, so
they are ignored. Saying hello only after a heartbeat has been *received* closes the PUB/SUB
slow-joiner gap: the scheduler never publishes a plan that this rank could miss.

Rank 0 pushes a `StepResult` for every plan it executes; an exception in `execute` becomes
`StepResult(error=...)`, never a silent death. Liveness is not latency: the heartbeat thread
(`heartbeat.py`) keeps saying "alive" while a long step computes, so the scheduler bounds a step
by its own step timeout, not by the heartbeat timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Protocol

import zmq

from pagedserve.services.gpu_worker.cpu_threads import ThreadGovernor
from pagedserve.services.gpu_worker.heartbeat import HeartbeatSender
from pagedserve.shared.protocol import (
    ROLE_SCHEDULER,
    Heartbeat,
    Shutdown,
    StepPlan,
    StepResult,
    WorkerHello,
)
from pagedserve.shared.transport import PlanSubscriber, ResultPusher

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2


class Runner(Protocol):
    """What the loop needs of `ModelRunner`."""

    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    vocab_size: int

    def execute(self, plan: StepPlan) -> StepResult | None: ...

    def drop_all(self) -> None:
        """Forget every sequence (a new scheduler epoch, or the scheduler lost)."""

    def forget_failed(self, plan: StepPlan) -> None:
        """`execute(plan)` raised: drop the plan's sequences."""


class WorkerLoop:
    def __init__(
        self,
        runner: Runner,
        rank: int,
        world_size: int,
        plan_address: str,
        result_address: str,
        model_name: str,
        scheduler_timeout_s: float = 10.0,
        thread_governor: ThreadGovernor | None = None,
    ) -> None:
        self.runner = runner
        self.thread_governor = thread_governor
        self.rank = rank
        self.world_size = world_size
        self.plan_address = plan_address
        self.result_address = result_address
        self.model_name = model_name
        self.scheduler_timeout_s = scheduler_timeout_s
        self.epoch: str | None = None
        self.last_scheduler_seen = 0.0
        self.stop_event = threading.Event()  # set by a signal handler: exit at the next poll

    def run(self) -> None:
        context = zmq.Context()
        subscriber = PlanSubscriber(context, self.plan_address)
        pusher = ResultPusher(context, self.result_address)
        heartbeat = HeartbeatSender(context, self.result_address, self.rank)
        heartbeat.start()
        logger.info("worker %d ready (num_blocks=%d)", self.rank, self.runner.num_blocks)
        try:
            self._serve(subscriber, pusher, heartbeat)
        finally:
            heartbeat.stop()
            subscriber.close()
            pusher.close()
            context.term()

    def _serve(
        self, subscriber: PlanSubscriber, pusher: ResultPusher, heartbeat: HeartbeatSender
    ) -> None:
        while not self.stop_event.is_set():
            if self.thread_governor is not None:
                self.thread_governor.poll()
            message = subscriber.recv(timeout_s=POLL_INTERVAL_S)
            if message is None:
                self._check_scheduler_alive()
            elif isinstance(message, Heartbeat):
                self._on_heartbeat(message, pusher)
            elif isinstance(message, StepPlan):
                if self.epoch is not None:
                    heartbeat.last_step_id = message.step_id
                    self._execute(message, pusher)
            elif isinstance(message, Shutdown):
                logger.info("worker %d: shutdown requested (%s)", self.rank, message.reason)
                return
            else:
                logger.warning("worker %d: ignoring %s", self.rank, type(message).__name__)

    def _on_heartbeat(self, heartbeat: Heartbeat, pusher: ResultPusher) -> None:
        if heartbeat.role != ROLE_SCHEDULER:
            return
        epoch = heartbeat.epoch
        self.last_scheduler_seen = time.monotonic()
        if epoch == self.epoch:
            return
        self._drop_sequences()
        self.epoch = epoch
        pusher.send(
            WorkerHello(
                rank=self.rank,
                world_size=self.world_size,
                num_blocks=self.runner.num_blocks,
                block_size=self.runner.block_size,
                max_model_len=self.runner.max_model_len,
                model=self.model_name,
                pid=os.getpid(),
                max_num_batched_tokens=self.runner.max_num_batched_tokens,
                vocab_size=self.runner.vocab_size,
                num_speculative_tokens=self.runner.num_speculative_tokens,
                sliding_windows=list(self.runner.sliding_windows),
            )
        )
        logger.info("worker %d: hello to scheduler epoch %s", self.rank, epoch)

    def _check_scheduler_alive(self) -> None:
        if self.epoch is None:
            return
        silent_s = time.monotonic() - self.last_scheduler_seen
        if silent_s > self.scheduler_timeout_s:
            logger.warning(
                "worker %d: no scheduler heartbeat for %.1fs (timeout %.1fs): dropping state, "
                "waiting to say hello again",
                self.rank,
                silent_s,
                self.scheduler_timeout_s,
            )
            self._drop_sequences()
            self.epoch = None

    def _drop_sequences(self) -> None:
        self.runner.drop_all()

    def _execute(self, plan: StepPlan, pusher: ResultPusher) -> None:
        try:
            result = self.runner.execute(plan)
        except Exception as exc:
            logger.error(
                "worker %d: step %d failed:\n%s", self.rank, plan.step_id, traceback.format_exc()
            )
            self.runner.forget_failed(plan)
            result = StepResult(
                step_id=plan.step_id,
                seq_ids=[],
                token_ids=[],
                error=f"worker {self.rank}: {type(exc).__name__}: {exc}",
            )
        if self.rank == 0 and result is not None:
            pusher.send(result)
