"""The scheduler process: Redis in, step plans out to the workers, results back, token deltas
out to the gateways.

    EngineLoop.run():  bind the worker link, set up Redis, wait for every rank's hello,
                       derive the engine's shape (engine_shape.py), build the Scheduler,
                       then StepLoop.run() until stopped (draining for `drain_timeout_s`)
    StepLoop, one step:
        read new intake and apply it                     (intake.py -> ledger.py)
        plan = schedule()  ->  publish to every worker rank          (worker_link.py)
        while the workers compute: flush the outbox                  (outbox.py)
        await rank 0's result (bounded by `step_timeout_s`)  ->  update_from_output()
        deltas -> ledger -> outbox; the engine status too if its gauges moved
    beside it: the status record every second (status_reporter.py), the claim and gateway
    watchers (watchers.py); a lost worker rank -> worker_recovery.py

Writing step N's outputs while step N+1 computes keeps that Redis hop off the critical path;
new requests are read just before planning, so one that arrived while a step computed is in
the very next plan. When nothing is left to schedule the outputs are written at once. A Redis
error is logged and retried with capped exponential backoff (backoff.py); nothing collected is
dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from redis.exceptions import RedisError

from pagedserve.services.scheduler.backoff import RedisBackoff
from pagedserve.services.scheduler.engine_shape import EngineShape
from pagedserve.services.scheduler.intake import Intake
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.status_reporter import link_status
from pagedserve.services.scheduler.step_loop import StepLoop, StepLoopConfig
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.redis_client import RedisTarget, async_redis
from pagedserve.shared.status import FINISHED_REQUEST_STATUS_TTL_S

logger = logging.getLogger(__name__)

GATEWAY_CHECK_INTERVAL_S = 3.0
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_SOCKET_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineLoopConfig:
    engine_id: str
    redis_url: str
    namespace: str
    plan_address: str
    result_address: str
    scheduler_config: SchedulerConfig  # its max_model_len caps what the workers report
    cache_config: CacheConfig
    tensor_parallel_size: int = 1
    worker_timeout_s: float = 10.0  # a rank silent (no heartbeat) this long is lost
    step_timeout_s: float = 60.0  # a step whose result takes longer than this: workers lost
    drain_timeout_s: float = 5.0  # on SIGTERM: how long running requests may finish
    worker_recovery_timeout_s: float = 60.0  # workers lost this long: fail unfinished requests
    finished_request_ttl_s: int = FINISHED_REQUEST_STATUS_TTL_S  # a finished request's record
    gateway_check_interval_s: float = GATEWAY_CHECK_INTERVAL_S  # dead-gateway sweep period
    redis_sentinel: str | None = None  # "HOST:PORT,.../SERVICE": the primary via sentinels

    def __post_init__(self) -> None:
        if self.finished_request_ttl_s < 1:
            raise ValueError(
                f"--finished-request-ttl must be at least 1 s, got {self.finished_request_ttl_s}"
            )
        if self.scheduler_config.async_scheduling and self.tensor_parallel_size != 1:
            raise ValueError(
                "async scheduling needs tensor_parallel_size 1 (only rank 0 samples, and the "
                f"other ranks could not run on its samples), got {self.tensor_parallel_size}"
            )

    @property
    def redis_target(self) -> RedisTarget:
        return RedisTarget.of(self.redis_url, self.redis_sentinel)

    def step_loop_config(self) -> StepLoopConfig:
        return StepLoopConfig(
            engine_id=self.engine_id,
            step_timeout_s=self.step_timeout_s,
            drain_timeout_s=self.drain_timeout_s,
            worker_recovery_timeout_s=self.worker_recovery_timeout_s,
            gateway_check_interval_s=self.gateway_check_interval_s,
        )


class EngineLoop:
    def __init__(self, config: EngineLoopConfig) -> None:
        self.config = config
        # Timeouts so that a Redis host that vanished from the network (no reset, no answer)
        # fails calls like a dead one instead of holding the engine: its blocking reads wait
        # 100 ms, far below the socket timeout.
        self.redis = async_redis(
            config.redis_target,
            decode_responses=False,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
        )
        self.io = RedisIO(
            self.redis, RedisKeys(config.namespace), config.engine_id, config.finished_request_ttl_s
        )
        self.link = WorkerLink(
            config.plan_address,
            config.result_address,
            config.tensor_parallel_size,
            config.cache_config.block_size,
            config.worker_timeout_s,
        )
        self.backoff = RedisBackoff()
        self.stopping = asyncio.Event()
        self.intake = Intake(self.io, self.backoff, self.stopping)
        self.serving: StepLoop | None = None  # once the workers attached; for observers only

    def request_stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        self.link.start()
        try:
            await self.backoff.retry("set-up", self.io.setup, self.stopping)
            if self.stopping.is_set():
                return
            logger.info("scheduler ready (engine %s)", self.config.engine_id)
            scheduler = await self.attach()
            if scheduler is not None:
                self.serving = StepLoop(
                    self.config.step_loop_config(),
                    scheduler,
                    io=self.io,
                    link=self.link,
                    intake=self.intake,
                    backoff=self.backoff,
                    stopping=self.stopping,
                )
                await self.serving.run()
        finally:
            await self.link.close()
            await self.redis.aclose()
            logger.info("scheduler %s exits", self.config.engine_id)

    async def attach(self) -> Scheduler | None:
        """Wait for every rank's hello; the Scheduler that fits them (None if stopped first)."""
        while not self.link.is_ready:
            with contextlib.suppress(RedisError):
                await self.io.write_engine_status(
                    link_status(self.config.engine_id, self.link, workers_alive=False)
                )
            if self.stopping.is_set():
                return None
            await self.link.wait_ready(1.0)
        config = self.config
        shape = EngineShape.derive(self.link.hellos, config.scheduler_config, config.cache_config)
        self.link.require(shape)
        logger.info("workers ready: %d rank(s), %s", config.tensor_parallel_size, shape.describe())
        return Scheduler(
            shape.scheduler_config(config.scheduler_config),
            shape.cache_config(config.cache_config),
            vocab_size=shape.vocab_size,
        )
