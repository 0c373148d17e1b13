"""The engine's status record in Redis (`shared/status.py`), its throughput log line and its
idle integrity check.

The record is written every `STATUS_INTERVAL_S` (that keeps it from expiring, which is how
other engines and the gateways tell a live engine). A step that changed what the gateways show
as engine gauges (running, waiting, KV blocks) also writes those fields alone, at most every
`GAUGE_INTERVAL_S`, and the step that empties the engine writes the whole record: the gateways
read the records every 0.25 s, so `/metrics` loses nothing, and most steps write one XADD with
no MULTI/EXEC around it (until 2026-12-05 every such step rewrote all ~50 fields).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import fields, replace

from redis.exceptions import RedisError

from pagedserve.services.scheduler.ledger import Ledger
from pagedserve.services.scheduler.outbox import Outbox
from pagedserve.services.scheduler.redis_io import RedisIO
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.stats import SchedulerStats
from pagedserve.services.scheduler.status_metrics import metric_fields
from pagedserve.services.scheduler.step_clock import StepClock
from pagedserve.services.scheduler.worker_link import WorkerLink
from pagedserve.shared.status import STATUS_INTERVAL_S, EngineStatus, to_fields

logger = logging.getLogger(__name__)

# the gauges go with a step's writes at most this often (the gateways read the records every
# 0.25 s), and the whole record at once when the engine has emptied
GAUGE_INTERVAL_S = 0.1
INTEGRITY_CHECK_INTERVAL_S = 5.0
THROUGHPUT_LOG_INTERVAL_S = 10.0
# what every step that moved the gauges writes (`after_step`)
GAUGE_FIELDS = frozenset(
    ("engine_id", "time", "workers_alive", "num_running", "num_waiting", "num_free_blocks",
     "kv_usage")
)  # fmt: skip
# the scheduler's counters that the status record carries, under the same names
STATS_IN_STATUS = tuple(
    f.name for f in fields(EngineStatus) if f.name in {g.name for g in fields(SchedulerStats)}
)


def link_status(engine_id: str, link: WorkerLink, workers_alive: bool) -> EngineStatus:
    """The status of an engine whose scheduler holds no requests yet (waiting for workers)."""
    hellos = link.hellos
    return EngineStatus(
        engine_id=engine_id,
        time=time.time(),
        workers_alive=workers_alive,
        num_workers=len(hellos),
        model=hellos[0].model if hellos else "",
        pid=os.getpid(),
        host=socket.gethostname(),
    )


class StatusReporter:
    def __init__(
        self,
        io: RedisIO,
        link: WorkerLink,
        scheduler: Scheduler,
        ledger: Ledger,
        stopping: asyncio.Event,
        clock: StepClock | None = None,
    ) -> None:
        self._io = io
        self._clock = clock or StepClock()
        self._link = link
        self._scheduler = scheduler
        self._ledger = ledger
        self._stopping = stopping
        self._last_gauges: tuple[int, int, int] | None = None
        self._gauges_written_at = -GAUGE_INTERVAL_S  # monotonic
        self._was_empty = False  # at the last after_step (False at start: the first writes all)
        self._last_integrity_check = 0.0  # monotonic
        self.integrity_error: str | None = None  # the last failed idle check
        self.integrity_checked_at = 0.0  # unix seconds

    def status(self, workers_alive: bool | None = None) -> EngineStatus:
        if workers_alive is None:
            workers_alive = self._workers_alive()
        base = link_status(self._ledger.engine_id, self._link, workers_alive)
        stats = self._scheduler.stats()
        return replace(
            base,
            integrity_ok=self.integrity_error is None,
            integrity_checked_at=self.integrity_checked_at,
            **{name: getattr(stats, name) for name in STATS_IN_STATUS},
            iteration_tokens=self._scheduler.iteration_tokens.encode(),
            block_size=self._scheduler.block_size,
            scheduling_s=self._clock.scheduling_s,
            step_in_flight_s=self._clock.in_flight_s,
            worker_execute_s=self._clock.worker_execute_s,
            steps_planned_ahead=self._clock.planned_ahead,
            **metric_fields(self._scheduler),
        )

    def _workers_alive(self) -> bool:
        link = self._link
        return link.is_ready and link.workers_alive() and not self._stopping.is_set()

    def after_step(self, outbox: Outbox) -> None:
        """Queue the engine gauges with the step's writes if they moved and the last ones went
        out `GAUGE_INTERVAL_S` ago: a few hash fields, not the whole record (its counters and
        histograms follow every STATUS_INTERVAL_S). The step that empties the engine writes
        the whole record at once, so that it counts every request whose last delta the
        gateways read. A move held back goes out with a later step, or from the idle loop,
        which calls this too."""
        stats = self._scheduler.stats()
        gauges = (stats.num_running, stats.num_waiting, stats.num_free_blocks)
        empty = stats.num_running == 0 and stats.num_waiting == 0
        just_emptied, self._was_empty = empty and not self._was_empty, empty
        now = time.monotonic()
        if just_emptied:
            fields = to_fields(self.status())
        elif gauges == self._last_gauges or now - self._gauges_written_at < GAUGE_INTERVAL_S:
            return
        else:
            fields = self.gauge_fields(stats)
        self._last_gauges, self._gauges_written_at = gauges, now
        outbox.set_engine_fields(fields)

    def gauge_fields(self, stats: SchedulerStats) -> dict[str, str]:
        """The record's gauges, with what a record needs to read alone (its engine, time and
        liveness) should the key have been lost since the last whole write."""
        record = EngineStatus(
            engine_id=self._ledger.engine_id,
            time=time.time(),
            workers_alive=self._workers_alive(),
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_free_blocks=stats.num_free_blocks,
            kv_usage=stats.kv_usage,
        )
        return {name: value for name, value in to_fields(record).items() if name in GAUGE_FIELDS}

    # -- integrity -------------------------------------------------------------------------------

    def check_integrity_if_due(self) -> None:
        if time.monotonic() - self._last_integrity_check > INTEGRITY_CHECK_INTERVAL_S:
            self.check_integrity()

    def check_integrity(self) -> None:
        """Run the scheduler's full invariant check on an idle engine. A failure is a bug: it
        is logged and flagged in the EngineStatus (`integrity_ok`), and serving goes on."""
        self._last_integrity_check = time.monotonic()
        self.integrity_checked_at = time.time()
        try:
            self._scheduler.check_integrity()
        except AssertionError as exc:
            if self.integrity_error is None:
                logger.error("integrity check failed: %s", exc)
            self.integrity_error = str(exc)
            return
        self.integrity_error = None

    # -- the periodic record and log -------------------------------------------------------------

    async def report_forever(self) -> None:
        last_log, last_tokens, last_steps = time.monotonic(), 0, 0
        while True:
            status = self.status()
            try:
                await self._io.write_engine_status(status)
            except RedisError as exc:
                logger.warning("engine status write failed: %s", exc)
            elapsed = time.monotonic() - last_log
            if elapsed >= THROUGHPUT_LOG_INTERVAL_S:
                num_tokens = self._ledger.num_generated_tokens
                if status.num_steps != last_steps:
                    _log_throughput(status, elapsed, num_tokens - last_tokens, last_steps)
                last_log, last_tokens, last_steps = time.monotonic(), num_tokens, status.num_steps
            await asyncio.sleep(STATUS_INTERVAL_S)


def _log_throughput(status: EngineStatus, elapsed: float, num_tokens: int, last_steps: int) -> None:
    logger.info(
        "%.1f steps/s, %.1f generated tokens/s, %d running, %d waiting, KV cache %.1f%% used",
        (status.num_steps - last_steps) / elapsed,
        num_tokens / elapsed,
        status.num_running,
        status.num_waiting,
        100 * status.kv_usage,
    )
