"""The step loop of an attached engine (the Scheduler is built), and the parts around it:
see `engine_loop.py` for the shape of one step.

With async scheduling (`SchedulerConfig.async_scheduling`) the next step is planned and
published while the last one computes, whenever the Scheduler says nothing falls behind for
it (`can_plan_ahead`): the worker finds its next plan waiting when it finishes a step, and the
scheduler's own work (applying results, planning, Redis) overlaps the model's. At most two
plans are in flight; results are applied in plan order.

The engine loop hands it its parts explicitly: the engine's Redis IO, worker link, intake,
backoff and stop event (which outlive it), the Scheduler, and the few settings it reads
(`StepLoopConfig`). It builds what lives only while it serves: the outbox, the ledger, the
step clock, the status reporter and the cache publisher."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from redis.exceptions import RedisError

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.cache_publisher import CachePublisher
from pagedserve.services.scheduler.intake import Intake
from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO, StreamEntry
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.status_reporter import StatusReporter
from pagedserve.services.scheduler.step_clock import StepClock
from pagedserve.services.scheduler.watchers import (
    CLAIM_MIN_IDLE_MS,
    claim_abandoned_forever,
    watch_gateways_forever,
)
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.services.scheduler.worker_recovery import recover_workers
from pagedserve.shared.protocol import StepPlan
from pagedserve.shared.tasks import cancel_and_wait, start_background

logger = logging.getLogger(__name__)

READ_COUNT = 64  # request entries taken per read, at most
IDLE_BLOCK_MS = 100  # blocking read when there is nothing to run
MAX_PLANS_OUT = 2  # async scheduling: the plan computing and the one planned on its samples


@dataclass(frozen=True)
class StepLoopConfig:
    """What the step loop reads of the engine's settings (their defaults and meaning:
    `EngineLoopConfig`, which makes this one)."""

    engine_id: str
    step_timeout_s: float
    drain_timeout_s: float
    worker_recovery_timeout_s: float
    gateway_check_interval_s: float


@dataclass(frozen=True, slots=True)
class InFlight:
    """A published plan whose result is awaited."""

    plan: StepPlan
    published: float  # perf_counter time


class StepLoop:
    """The step loop of an attached engine, and the parts around it."""

    def __init__(
        self,
        config: StepLoopConfig,
        scheduler: Scheduler,
        *,
        io: RedisIO,
        link: WorkerLink,
        intake: Intake,
        backoff: RedisBackoff,
        stopping: asyncio.Event,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.link = link
        self.io = io
        self.intake = intake
        self.stopping = stopping
        self.backoff = backoff
        self.outbox = Outbox(io, backoff)
        self.ledger = Ledger(scheduler, self.outbox, config.engine_id)
        self.clock = StepClock()
        self.status = StatusReporter(io, link, scheduler, self.ledger, stopping, self.clock)
        self.cache_publisher = CachePublisher(io.redis, io.keys, config.engine_id, scheduler.kv)
        self.in_flight: deque[InFlight] = deque()  # oldest first; two at most
        self._last_received = 0.0  # perf_counter time the last result came in

    async def run(self) -> None:
        tasks = [
            start_background(self.status.report_forever(), "engine-status"),
            start_background(
                watch_gateways_forever(
                    self.io, self.ledger, self.intake, self.config.gateway_check_interval_s
                ),
                "gateway-watch",
            ),
            start_background(claim_abandoned_forever(self.io, self.intake, self.stopping), "claim"),
            start_background(
                self.cache_publisher.publish_forever(self.stopping), "cache-publisher"
            ),
        ]
        try:
            await self._resume_own_pending()
            await self._serve()
        finally:
            await cancel_and_wait(tasks)
            await self.outbox.flush()
            with contextlib.suppress(RedisError):
                await self.io.write_engine_status(self.status.status(workers_alive=False))
                await self.cache_publisher.withdraw()

    async def _resume_own_pending(self) -> None:
        """Requests this engine id was given in a previous life, and dead engines' ones."""
        pending = await self.backoff.retry("pending read", self._own_and_abandoned, self.stopping)
        if pending:
            logger.info(
                "resuming %d un-ACKed request(s) of engine %s", len(pending), self.config.engine_id
            )
            self.intake.add_entries(pending)

    async def _own_and_abandoned(self) -> list[StreamEntry]:
        own = await self.io.read_own_pending()
        return own + await self.io.claim_abandoned(CLAIM_MIN_IDLE_MS)

    async def _serve(self) -> None:
        drain_deadline: float | None = None
        while True:
            if self.stopping.is_set():
                drain_deadline = drain_deadline or time.monotonic() + self.config.drain_timeout_s
                done = not self.scheduler.has_unfinished_requests() and not self.in_flight
                if done or time.monotonic() > drain_deadline:
                    return
            if not self.link.is_ready:
                await self._drop_in_flight()
                if not await recover_workers(
                    self.link,
                    self.ledger,
                    self.outbox,
                    self.config.worker_recovery_timeout_s,
                    self.stopping,
                ):
                    return
            await self._step()

    async def _step(self) -> None:
        """Plan and publish steps until two are out (one, unless the scheduler may plan ahead
        of the last one's result), then apply the oldest result."""
        started = self.clock.start()
        await self._read_arrivals()
        self._apply_intake()
        while len(self.in_flight) < MAX_PLANS_OUT:
            plan_ahead = bool(self.in_flight)
            if plan_ahead and not self.scheduler.can_plan_ahead():
                break
            plan = self.scheduler.schedule(plan_ahead)
            if plan.is_empty and not (plan.finished_seq_ids or plan.preempted_seq_ids):
                break
            self.ledger.note_scheduled(plan)
            published = self.clock.published(started)  # before: the worker may start
            self.link.publish(plan)
            self.in_flight.append(InFlight(plan, published))
            self.clock.planned_ahead += plan_ahead
            started = published
        if not self.in_flight:
            await self._idle()
            return
        await self._apply_oldest()

    async def _read_arrivals(self) -> None:
        """Read what arrived during the last step just before planning the next: a request
        that arrives while a step computes is in the very next plan (read while the step
        computed, it would wait for the plan after). Not while Redis is backed off: the steps
        go on, and the first read after the back-off ends tries again."""
        if self.backoff.remaining_s <= 0:
            await self.intake.read(self._read_budget(), block_ms=None)

    async def _apply_oldest(self) -> None:
        flight = self.in_flight[0]
        flush = asyncio.create_task(self.outbox.flush())  # while the workers compute
        result = await self.link.wait_result(flight.plan.step_id, self.config.step_timeout_s)
        # the worker started on it when it was published or, if it was queued behind the
        # last plan, when that one's result came
        started = max(flight.published, self._last_received)
        received = self._last_received = self.clock.received(
            started, result.execute_time_s if result else 0.0
        )
        await flush
        self.in_flight.popleft()
        if result is not None:
            self.ledger.collect(self.scheduler.update_from_output(flight.plan, result))
        else:
            await self._drop_in_flight()
        self.clock.updated(received)
        self.status.after_step(self.outbox)

    async def _drop_in_flight(self) -> None:
        """The workers were lost: the link has answered every awaited plan with None, and
        recovery preempts what they ran."""
        while self.in_flight:
            flight = self.in_flight.popleft()
            await self.link.wait_result(flight.plan.step_id, self.config.step_timeout_s)

    async def _idle(self) -> None:
        self.status.after_step(self.outbox)
        await self.outbox.flush()
        busy = self.scheduler.has_unfinished_requests()
        if not busy:
            self.status.check_integrity_if_due()
        if busy:  # waiting requests that cannot be scheduled yet: do not spin
            await asyncio.sleep(0.005)
        block_ms = None if busy or self.stopping.is_set() else IDLE_BLOCK_MS
        await self.intake.read(self._read_budget(), block_ms)

    def _apply_intake(self) -> None:
        entries, aborts = self.intake.take()
        for entry in entries:
            self.ledger.admit(entry)
        for abort in aborts:
            self.ledger.abort(abort.request_ids, abort.reason)

    def _read_budget(self) -> int:
        """How many new requests to take now: what this engine can start soon, so that other
        engines get the rest of the shared stream."""
        if self.stopping.is_set():
            return 0
        config = self.scheduler.config
        stats = self.scheduler.stats()
        queued = stats.num_running + stats.num_waiting + len(self.intake)
        room = min(config.max_waiting - stats.num_waiting, 2 * config.max_num_seqs - queued)
        return max(0, min(READ_COUNT, room))
