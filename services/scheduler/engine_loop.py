"""The scheduler process's main loop: Redis in, step plans out to the workers, results back,
token deltas out to the gateways.

One step, in order:
    apply the intake read during the previous step (add requests, aborts)
    plan = schedule()  ->  publish to every worker rank
    while the workers compute: write the previous step's outputs and read new intake (Redis)
    await rank 0's result  ->  update_from_output()  ->  queue the deltas for the next write
Writing step N's outputs while step N+1 computes keeps Redis hops off the critical path; when
nothing is left to schedule the outputs are written at once.

Failure handling: a Redis error is logged and retried with capped exponential backoff (the
writes of a step are kept until they succeed); a lost worker rank (see `worker_link.py`) marks
the engine unhealthy, preempts every running request (they are recomputed) and waits for the
ranks to say hello again; if none comes back within `worker_recovery_timeout_s`, every
unfinished request is failed with an `engine_error` (and the engine keeps waiting for workers).
Requests of a gateway whose heartbeat key expired are aborted. Every `CLAIM_INTERVAL_S` the
engine claims the un-ACKed requests of dead engines (`RedisIO.claim_abandoned`); they are run
again from their prompts, and the gateway drops the replayed tokens (`ReplayGuard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from services.scheduler.errors import QueueFullError, RequestRejectedError
from services.scheduler.redis_io import RedisIO, StepWrites, StreamEntry
from services.scheduler.scheduler import Scheduler
from services.scheduler.worker_link import WorkerLink
from shared.config import CacheConfig, SchedulerConfig
from shared.keys import RedisKeys
from shared.protocol import (
    ERROR_ENGINE,
    ERROR_INVALID_REQUEST,
    ERROR_QUEUE_FULL,
    AbortRequest,
    GenerateRequest,
    StepPlan,
    TokenDelta,
)
from shared.status import EngineStatus

logger = logging.getLogger(__name__)

READ_COUNT = 64  # request entries taken per read, at most
IDLE_BLOCK_MS = 100  # blocking read when there is nothing to run
STATUS_INTERVAL_S = 1.0
GATEWAY_CHECK_INTERVAL_S = 3.0
INTEGRITY_CHECK_INTERVAL_S = 5.0
THROUGHPUT_LOG_INTERVAL_S = 10.0
MAX_BACKOFF_S = 5.0
CLAIM_INTERVAL_S = 5.0  # how often to look for dead engines' requests
CLAIM_MIN_IDLE_MS = 10_000  # an entry is claimed once idle this long (and its engine is dead)
RECENT_ABORTS = 10_000  # aborts of requests not (yet) seen here, remembered this many
GONE_GATEWAYS = 1_000  # gateways found dead, remembered this many


@dataclass(frozen=True)
class EngineLoopConfig:
    engine_id: str
    redis_url: str
    namespace: str
    plan_address: str
    result_address: str
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    tensor_parallel_size: int = 1
    worker_timeout_s: float = 10.0
    max_model_len: int | None = None  # None: what the workers report
    drain_timeout_s: float = 5.0  # on SIGTERM: how long running requests may finish
    worker_recovery_timeout_s: float = 60.0  # workers lost this long: fail unfinished requests
    gateway_check_interval_s: float = GATEWAY_CHECK_INTERVAL_S  # dead-gateway sweep period


@dataclass(slots=True)
class Inflight:
    """What the loop knows of a request beyond the Scheduler: where it came from."""

    entry_id: str
    gateway_id: str
    scheduled: bool = False
    got_first_token: bool = False


def _finish_state(delta: TokenDelta) -> str:
    if delta.finish_reason == "abort":
        return "aborted"
    return "failed" if delta.finish_reason == "error" else "finished"


class EngineLoop:
    def __init__(self, config: EngineLoopConfig) -> None:
        self.config = config
        self.keys = RedisKeys(config.namespace)
        self.redis = aioredis.Redis.from_url(config.redis_url, decode_responses=False)
        self.io = RedisIO(self.redis, self.keys, config.engine_id)
        self.link = WorkerLink(
            config.plan_address,
            config.result_address,
            config.tensor_parallel_size,
            config.cache_config.block_size,
            config.worker_timeout_s,
            config.scheduler_config.max_num_batched_tokens,
        )
        self.scheduler: Scheduler | None = None
        self.inflight: dict[str, Inflight] = {}
        self.recent_aborts: OrderedDict[str, str] = OrderedDict()
        # gateway id -> unix time it was found dead: its requests that arrived before then and
        # are still in the stream are aborted when read (a restarted gateway may reuse the id)
        self.gone_gateways: OrderedDict[str, float] = OrderedDict()
        self.writes = StepWrites.empty()
        self.intake: list[StreamEntry] = []
        self.abort_intake: list[AbortRequest] = []
        self.stopping = asyncio.Event()
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self.num_generated_tokens = 0  # total, for the periodic throughput line
        self._last_integrity_check = 0.0
        self.integrity_error: str | None = None  # the last failed idle check, for the status
        self.integrity_checked_at = 0.0  # unix seconds
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        self.link.start()
        await self._setup_redis()
        self._tasks = [
            asyncio.create_task(self._status_forever(), name="engine-status"),
            asyncio.create_task(self._gateway_watch_forever(), name="gateway-watch"),
            asyncio.create_task(self._claim_forever(), name="claim-abandoned"),
        ]
        logger.info("scheduler ready (engine %s)", self.config.engine_id)
        try:
            if await self._attach_workers():
                await self._resume_own_pending()
                await self._serve()
        finally:
            await self._shutdown()

    async def _setup_redis(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.io.setup()
                return
            except RedisError as exc:
                await self._redis_failed("set-up", exc)

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(RedisError):
            await self._flush()
            await self.io.write_engine_status(self._engine_status(workers_alive=False))
        await self.link.close()
        await self.redis.aclose()
        logger.info("scheduler %s exits", self.config.engine_id)

    async def _attach_workers(self) -> bool:
        """Wait for every rank's hello, then build the Scheduler (first time) to fit them."""
        while not await self.link.wait_ready(1.0):
            if self.stopping.is_set():
                return False
        if self.scheduler is None:
            num_blocks = self.link.num_blocks
            block_size = self.link.block_size  # the workers' when the config left it out
            budget = self.link.max_num_batched_tokens  # likewise
            max_model_len = min(self.config.max_model_len or 1 << 62, self.link.max_model_len)
            self.scheduler = Scheduler(
                replace(
                    self.config.scheduler_config,
                    max_model_len=max_model_len,
                    max_num_batched_tokens=budget,
                ),
                replace(self.config.cache_config, num_blocks=num_blocks, block_size=block_size),
            )
            self.link.min_num_blocks = num_blocks
            logger.info(
                "workers ready: %d rank(s), %d KV blocks of %d tokens, max_model_len %d, "
                "%d tokens per step",
                self.config.tensor_parallel_size,
                num_blocks,
                block_size,
                max_model_len,
                budget,
            )
        return True

    async def _recover_workers(self) -> bool:
        assert self.scheduler is not None
        num_preempted = self.scheduler.preempt_all()
        reason = self.link.lost_reason
        logger.error(
            "workers lost (%s): %d running request(s) preempted, to be recomputed",
            reason,
            num_preempted,
        )
        self.link.new_epoch()
        await self._flush()
        timeout_s = self.config.worker_recovery_timeout_s
        deadline: float | None = time.monotonic() + timeout_s
        while not await self.link.wait_ready(1.0):
            if self.stopping.is_set():
                return False
            if deadline is not None and time.monotonic() > deadline:
                self._fail_unfinished(
                    f"the engine lost its workers ({reason}) and none came back within "
                    f"{timeout_s:g}s"
                )
                await self._flush()
                deadline = None
        return await self._attach_workers()

    def _fail_unfinished(self, message: str) -> None:
        assert self.scheduler is not None
        deltas = self.scheduler.abort_requests(list(self.inflight), "workers lost")
        logger.error("failing %d unfinished request(s): %s", len(deltas), message)
        failed = [
            replace(d, finish_reason="error", error=message, error_code=ERROR_ENGINE)
            for d in deltas
        ]
        self._collect(failed)

    # -- the step loop ---------------------------------------------------------------------------

    async def _serve(self) -> None:
        assert self.scheduler is not None
        drain_deadline: float | None = None
        while True:
            if self.stopping.is_set():
                drain_deadline = drain_deadline or time.monotonic() + self.config.drain_timeout_s
                if (
                    not self.scheduler.has_unfinished_requests()
                    or time.monotonic() > drain_deadline
                ):
                    return
            if not self.link.is_ready and not await self._recover_workers():
                return
            await self._step()

    async def _step(self) -> None:
        assert self.scheduler is not None
        self._apply_intake()
        plan = self.scheduler.schedule()
        if plan.is_empty and not (plan.finished_seq_ids or plan.preempted_seq_ids):
            await self._idle()
            return
        self._note_scheduled(plan)
        self.link.publish(plan)
        io = asyncio.create_task(self._overlapped_io())
        result = await self.link.wait_result(plan.step_id, self.config.worker_timeout_s)
        await io
        if result is not None:
            self._collect(self.scheduler.update_from_output(plan, result))

    async def _idle(self) -> None:
        assert self.scheduler is not None
        await self._flush()
        busy = self.scheduler.has_unfinished_requests()
        if not busy and time.monotonic() - self._last_integrity_check > INTEGRITY_CHECK_INTERVAL_S:
            self._check_integrity()
        if busy:  # waiting requests that cannot be scheduled yet: do not spin
            await asyncio.sleep(0.005)
        await self._read_intake(block_ms=None if busy or self.stopping.is_set() else IDLE_BLOCK_MS)

    def _check_integrity(self) -> None:
        """Run the scheduler's full invariant check on an idle engine. A failure is a bug: it
        is logged and flagged in the EngineStatus (`integrity_ok`), and serving goes on."""
        assert self.scheduler is not None
        self._last_integrity_check = time.monotonic()
        self.integrity_checked_at = time.time()
        try:
            self.scheduler.check_integrity()
        except AssertionError as exc:
            if self.integrity_error is None:
                logger.error("integrity check failed: %s", exc)
            self.integrity_error = str(exc)
            return
        self.integrity_error = None

    async def _overlapped_io(self) -> None:
        await self._flush()
        await self._read_intake(block_ms=None)

    # -- intake ----------------------------------------------------------------------------------

    def _read_budget(self) -> int:
        """How many new requests to take now: what this engine can start soon, so that other
        engines get the rest of the shared stream."""
        assert self.scheduler is not None
        if self.stopping.is_set():
            return 0
        config = self.scheduler.config
        stats = self.scheduler.stats()
        queued = stats.num_running + stats.num_waiting + len(self.intake)
        room = min(config.max_waiting - stats.num_waiting, 2 * config.max_num_seqs - queued)
        return max(0, min(READ_COUNT, room))

    async def _read_intake(self, block_ms: int | None) -> None:
        if self._backoff_s and time.monotonic() < self._retry_at:
            await asyncio.sleep(min(0.1, self._retry_at - time.monotonic()))
            return
        try:
            # Await first, then extend: `self.intake += await ...` would hold the list it read
            # before the await, and the claim task replaces it meanwhile (entries were lost).
            entries = await self.io.read_new(self._read_budget(), block_ms)
            self.intake.extend(entries)
            aborts = await self.io.read_aborts()
            self.abort_intake.extend(aborts)
            self._backoff_s = 0.0
        except RedisError as exc:
            if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                # Redis lost its data (restarted without persistence): recreate the group.
                logger.warning("the consumer group is gone (%s): creating it again", exc)
                await self._setup_redis()
            else:
                await self._redis_failed("read", exc, wait=False)

    async def _resume_own_pending(self) -> None:
        while not self.stopping.is_set():
            try:
                pending = await self.io.read_own_pending()
                pending += await self.io.claim_abandoned(CLAIM_MIN_IDLE_MS)
                break
            except RedisError as exc:
                await self._redis_failed("pending read", exc)
        else:
            return
        if pending:
            logger.info(
                "resuming %d un-ACKed request(s) of engine %s", len(pending), self.config.engine_id
            )
        self.intake += pending

    def _apply_intake(self) -> None:
        assert self.scheduler is not None
        entries, self.intake = self.intake, []
        for entry in entries:
            self._admit(entry)
        aborts, self.abort_intake = self.abort_intake, []
        for abort in aborts:
            self._abort(abort.request_ids, abort.reason)

    def _admit(self, entry: StreamEntry) -> None:
        assert self.scheduler is not None
        request = entry.request
        if request is None:
            logger.error("dropping request entry %s: %s", entry.entry_id, entry.problem)
            self.writes.acked_entry_ids.append(entry.entry_id)
            return
        known = self.inflight.get(request.request_id)
        if known is not None:  # delivered twice (resume + claim, re-queued after a Redis loss)
            if known.entry_id != entry.entry_id:  # a second entry: nobody else will ACK it
                self.writes.acked_entry_ids.append(entry.entry_id)
            return
        self.inflight[request.request_id] = Inflight(entry.entry_id, request.gateway_id)
        reason = self.recent_aborts.pop(request.request_id, None)
        gone_at = self.gone_gateways.get(request.gateway_id)
        if gone_at is not None and request.arrival_time <= gone_at:
            reason = "gateway gone"
        if reason is not None:
            self._collect([TokenDelta(request.request_id, [], finish_reason="abort", error=reason)])
            return
        try:
            self.scheduler.add_request(request)
        except QueueFullError as exc:
            self._reject(request, str(exc), ERROR_QUEUE_FULL)
            return
        except RequestRejectedError as exc:
            self._reject(request, str(exc), ERROR_INVALID_REQUEST)
            return
        self.writes.set_status(request.request_id, engine_id=self.config.engine_id)

    def _reject(self, request: GenerateRequest, message: str, code: str) -> None:
        logger.info("rejecting %s: %s", request.request_id, message)
        delta = TokenDelta(
            request.request_id,
            [],
            finish_reason="error",
            error=message,
            error_code=code,
            num_prompt_tokens=len(request.prompt_token_ids),
        )
        self._collect([delta])

    def _abort(self, request_ids: list[str], reason: str) -> None:
        assert self.scheduler is not None
        known = [r for r in request_ids if r in self.inflight]
        for request_id in request_ids:
            if request_id not in self.inflight:
                self.recent_aborts[request_id] = reason
                if len(self.recent_aborts) > RECENT_ABORTS:
                    self.recent_aborts.popitem(last=False)
        if known:
            self._collect(self.scheduler.abort_requests(known, reason))

    # -- outputs ---------------------------------------------------------------------------------

    def _note_scheduled(self, plan: StepPlan) -> None:
        now = time.time()
        for seq in plan.new_seqs:
            inflight = self.inflight.get(seq.seq_id)
            if inflight is None:
                continue
            if not inflight.scheduled:
                inflight.scheduled = True
                self.writes.set_status(seq.seq_id, state="running", scheduled_at=now)
            else:
                self.writes.set_status(seq.seq_id, state="running")
        for seq_id in plan.preempted_seq_ids:
            if seq_id in self.inflight:
                self.writes.set_status(seq_id, state="preempted")

    def _collect(self, deltas: list[TokenDelta]) -> None:
        """Route deltas to their gateways' outboxes; finished requests get ACKed."""
        now = time.time()
        writes = self.writes
        for delta in deltas:
            inflight = self.inflight.get(delta.request_id)
            if inflight is None:
                continue
            self.num_generated_tokens += len(delta.token_ids)
            if inflight.gateway_id:
                writes.outputs.setdefault(inflight.gateway_id, []).append(delta)
            if delta.token_ids and not inflight.got_first_token:
                inflight.got_first_token = True
                writes.set_status(delta.request_id, first_token_at=now)
            if delta.finished:
                del self.inflight[delta.request_id]
                writes.acked_entry_ids.append(inflight.entry_id)
                writes.set_status(
                    delta.request_id,
                    state=_finish_state(delta),
                    finished_at=now,
                    finish_reason=delta.finish_reason,
                    num_prompt_tokens=delta.num_prompt_tokens,
                    num_output_tokens=delta.num_output_tokens,
                    engine_id=self.config.engine_id,
                    error=delta.error or "",
                )

    async def _flush(self) -> None:
        if not self.writes:
            return
        if self._backoff_s and time.monotonic() < self._retry_at:
            return
        writes, self.writes = self.writes, StepWrites.empty()
        try:
            await self.io.write_step(writes)
            self._backoff_s = 0.0
        except RedisError as exc:
            self._merge_back(writes)
            await self._redis_failed("write", exc, wait=False)

    def _merge_back(self, failed: StepWrites) -> None:
        """Put failed writes back in front of whatever was collected since."""
        newer, self.writes = self.writes, failed
        for gateway_id, deltas in newer.outputs.items():
            failed.outputs.setdefault(gateway_id, []).extend(deltas)
        failed.acked_entry_ids.extend(newer.acked_entry_ids)
        for request_id, fields in newer.statuses.items():
            failed.set_status(request_id, **fields)

    async def _redis_failed(self, what: str, exc: Exception, wait: bool = True) -> None:
        self._backoff_s = min(MAX_BACKOFF_S, max(0.1, self._backoff_s * 2))
        self._retry_at = time.monotonic() + self._backoff_s
        logger.warning("Redis %s failed (%s); retrying in %.1fs", what, exc, self._backoff_s)
        if wait:
            await asyncio.sleep(self._backoff_s)

    # -- background tasks ------------------------------------------------------------------------

    def _engine_status(self, workers_alive: bool) -> EngineStatus:
        common = dict(
            engine_id=self.config.engine_id,
            time=time.time(),
            workers_alive=workers_alive,
            num_workers=len(self.link.hellos),
            model=self.link.hellos[0].model if self.link.hellos else "",
            pid=os.getpid(),
            integrity_ok=self.integrity_error is None,
            integrity_checked_at=self.integrity_checked_at,
        )
        if self.scheduler is None:
            return EngineStatus(**common)
        stats = self.scheduler.stats()
        return EngineStatus(
            **common,
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_free_blocks=stats.num_free_blocks,
            num_total_blocks=stats.num_total_blocks,
            kv_usage=stats.kv_usage,
            prefix_cache_queries=stats.prefix_cache_queries,
            prefix_cache_hits=stats.prefix_cache_hits,
            num_preemptions=stats.num_preemptions,
            num_finished=stats.num_finished,
            num_steps=stats.num_steps,
            iteration_tokens=self.scheduler.iteration_tokens.encode(),
            block_size=self.scheduler.block_size,
        )

    async def _status_forever(self) -> None:
        last_log, last_tokens, last_steps = time.monotonic(), 0, 0
        while True:
            alive = self.link.is_ready and self.link.workers_alive() and not self.stopping.is_set()
            status = self._engine_status(alive)
            try:
                await self.io.write_engine_status(status)
            except RedisError as exc:
                logger.warning("engine status write failed: %s", exc)
            elapsed = time.monotonic() - last_log
            if elapsed >= THROUGHPUT_LOG_INTERVAL_S:
                if status.num_steps != last_steps:
                    logger.info(
                        "%.1f steps/s, %.1f generated tokens/s, %d running, %d waiting, "
                        "KV cache %.1f%% used",
                        (status.num_steps - last_steps) / elapsed,
                        (self.num_generated_tokens - last_tokens) / elapsed,
                        status.num_running,
                        status.num_waiting,
                        100 * status.kv_usage,
                    )
                last_log, last_tokens = time.monotonic(), self.num_generated_tokens
                last_steps = status.num_steps
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def _claim_forever(self) -> None:
        while True:
            await asyncio.sleep(CLAIM_INTERVAL_S)
            if self.scheduler is None or self.stopping.is_set():
                continue
            try:
                claimed = await self.io.claim_abandoned(CLAIM_MIN_IDLE_MS)
                self.intake.extend(claimed)
            except RedisError as exc:
                logger.warning("claiming dead engines' requests failed: %s", exc)

    async def _gateway_watch_forever(self) -> None:
        # A gateway counts as gone when its heartbeat key is missing at two checks in a row:
        # right after a Redis restart every key is missing until the next heartbeat (2 s).
        suspects: set[str] = set()
        while True:
            await asyncio.sleep(self.config.gateway_check_interval_s)
            gateway_ids = {i.gateway_id for i in self.inflight.values() if i.gateway_id}
            if not gateway_ids:
                continue
            try:
                missing = await self.io.missing_gateways(gateway_ids)
            except RedisError as exc:
                logger.warning("gateway heartbeat check failed: %s", exc)
                continue
            gone, suspects = missing & suspects, missing
            for gateway_id in gone:
                self.gone_gateways[gateway_id] = time.time()
                if len(self.gone_gateways) > GONE_GATEWAYS:
                    self.gone_gateways.popitem(last=False)
                request_ids = [r for r, i in self.inflight.items() if i.gateway_id == gateway_id]
                logger.warning(
                    "gateway %s is gone (heartbeat expired): aborting its %d request(s)",
                    gateway_id,
                    len(request_ids),
                )
                self.abort_intake.append(AbortRequest(request_ids, "gateway gone"))
