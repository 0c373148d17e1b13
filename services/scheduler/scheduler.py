"""The continuous-batching scheduler: which sequences run each step, and what the workers are
told. Four verbs as in vLLM v1: `add_request`, `schedule`, `update_from_output`,
`abort_requests`; plus `preempt_all` for a worker restart.

The work is split by responsibility: `request_sets.py` holds where every live request is and
the moves between waiting, running and finished; `step_planner.py` plans a step (what runs,
who is admitted or preempted, what the workers are sent); `result_applier.py` does what a
step's result says (tokens appended, requests finished, deltas out). This class wires them
and answers for the whole: validation, aborts, stats and integrity.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable

from pagedserve.services.scheduler.beam_groups import BeamGroups
from pagedserve.services.scheduler.block_residency import BlockResidency
from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.services.scheduler.finish_rules import FINISH_ABORT
from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.request_queue import BaseRequestQueue, make_request_queue
from pagedserve.services.scheduler.request_sets import FinishedRecord, RequestSets
from pagedserve.services.scheduler.request_validator import (
    check_beam_fits,
    check_fits,
    validate_request,
)
from pagedserve.services.scheduler.result_applier import ResultApplier
from pagedserve.services.scheduler.stats import SchedulerStats
from pagedserve.services.scheduler.step_planner import StepPlanner
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.iteration_histogram import IterationHistogram
from pagedserve.shared.protocol import GenerateRequest, StepPlan, StepResult, TokenDelta

logger = logging.getLogger(__name__)


def speculation_resolved(config: SchedulerConfig) -> SchedulerConfig:
    """`config` with no draft count left to the workers' default: an engine's shape resolves
    it (`EngineShape`); a scheduler built without workers has none to adopt, so it is off."""
    if config.num_speculative_tokens is None:
        return dataclasses.replace(config, num_speculative_tokens=0)
    return config


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, vocab_size: int = 0
    ) -> None:
        """`vocab_size` > 0: prompt and stop token ids must be below it, and drafts may count
        on below it (`ngram_proposer.py`)."""
        if cache_config.num_blocks is None:
            raise ValueError("cache_config.num_blocks must be set (the workers report it)")
        if cache_config.block_size is None:
            raise ValueError("cache_config.block_size must be set (the workers report it)")
        if scheduler_config.max_num_batched_tokens is None:
            raise ValueError(
                "scheduler_config.max_num_batched_tokens must be set (the workers report it)"
            )
        scheduler_config = speculation_resolved(scheduler_config)
        self._config = scheduler_config
        self.vocab_size = vocab_size
        self.block_size = cache_config.block_size
        self.num_blocks = cache_config.num_blocks
        kv = KVCacheManager(
            cache_config.num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            cache_config.sliding_window,
        )
        if cache_config.kv_cache_metrics_sample > 0:
            kv.pool.residency = BlockResidency(cache_config.kv_cache_metrics_sample)
        waiting = make_request_queue(scheduler_config.policy, scheduler_config.max_waiting)
        self._sets = RequestSets(kv, waiting)
        self._beams = BeamGroups(self._sets, scheduler_config.max_model_len)
        self._planner = StepPlanner(scheduler_config, self._sets, self._beams, vocab_size)
        self._applier = ResultApplier(scheduler_config, self._sets, self._beams)
        self._next_arrival_index = 0
        self._num_aborted = 0

    # -- what it holds (read-only views for the engine, metrics and tests) -----------------------

    @property
    def config(self) -> SchedulerConfig:
        return self._config

    @config.setter
    def config(self, config: SchedulerConfig) -> None:
        """A new config (e.g. speculation switched on between runs) reaches both halves."""
        config = speculation_resolved(config)
        self._config = self._planner.config = self._applier.config = config

    @property
    def kv(self) -> KVCacheManager:
        return self._sets.kv

    @property
    def waiting(self) -> BaseRequestQueue:
        return self._sets.waiting

    @property
    def running(self) -> list[Request]:
        """In admission order: the newest is last."""
        return self._sets.running

    @property
    def finished_requests(self) -> deque[FinishedRecord]:
        """The latest finished requests' outcomes and timelines (not their tokens)."""
        return self._sets.finished_requests

    @property
    def iteration_tokens(self) -> IterationHistogram:
        """Tokens per step (for metrics)."""
        return self._applier.iteration_tokens

    @property
    def spec_accepted_per_pos(self) -> list[int]:
        """Drafts accepted at each draft position so far (for metrics)."""
        return self._applier.accepted_per_pos

    # -- requests in and out -------------------------------------------------------------------

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request. Raises `RequestRejectedError` if it can never run here, or
        `QueueFullError` (retryable) if the waiting queue is at `max_waiting`."""
        self._validate(request)
        state = Request.from_generate(request, self._next_arrival_index, time.time())
        if request.sampling.beam_width:
            self._beams.start(state)
        else:
            self._sets.add(state)
        self._next_arrival_index += 1

    def abort_requests(self, request_ids: Iterable[str], reason: str = "abort") -> list[TokenDelta]:
        """Finish the given requests now (unknown ids are ignored), freeing their blocks."""
        deltas = []
        for request_id in request_ids:
            if request_id in self._beams:
                self._num_aborted += 1
                deltas.append(self._beams.fail(request_id, FINISH_ABORT))
                self._sets.drop_finished_from_running()
                continue
            request = self._sets.requests.get(request_id)
            if request is None:
                continue
            if request.status is RequestStatus.RUNNING:
                self._sets.running.remove(request)
            else:
                self._sets.waiting.remove(request)
            logger.debug("abort %s: %s", request_id, reason)
            self._num_aborted += 1
            deltas.append(self._sets.finish(request, FINISH_ABORT))
        return deltas

    def preempt_all(self) -> int:
        """The workers lost their state: every running sequence goes back to the head of the
        waiting queue, in its order, to be sent in full and recomputed. Returns how many."""
        num_preempted = self._sets.preempt_all_running()
        self._beams.forget_results()
        # The workers' KV is gone with their state, so no cached block may be hit any more.
        self.kv.reset_prefix_cache()
        return num_preempted

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash: later requests find no prefix of earlier ones, as on
        a fresh server (benchmarks that rerun a workload; vLLM's `LLM.reset_prefix_cache()`).
        Refused while a request is unfinished: blocks that running requests share must stay
        cached (an invariant `check_integrity` asserts), and a reset belongs between runs."""
        if self._sets.requests:
            raise ValueError(
                "cannot reset the prefix cache while requests are unfinished "
                f"({len(self.running)} running, {len(self.waiting)} waiting): "
                "finish or abort them first"
            )
        self.kv.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self._sets.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self._sets.requests.get(request_id)

    # -- one step --------------------------------------------------------------------------------

    def schedule(self, plan_ahead: bool = False) -> StepPlan:
        """Plan the next step (step_planner.py); every block it needs is allocated.
        `plan_ahead`: the last plan's result is not in yet (async scheduling)."""
        return self._planner.schedule(plan_ahead)

    def can_plan_ahead(self) -> bool:
        """Whether the next step may be planned before the last one's result (async
        scheduling on, and no running sequence would fall a step behind)."""
        return self._planner.can_plan_ahead()

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[TokenDelta]:
        """Apply what the workers sampled for `plan` (result_applier.py); returns one delta
        per sequence that got a token or finished. Sequences aborted or preempted since the
        plan are skipped."""
        return self._applier.update_from_output(plan, result)

    # -- validation, stats, invariants -----------------------------------------------------------

    def _validate(self, request: GenerateRequest) -> None:
        if request.request_id in self._sets.requests or request.request_id in self._beams:
            raise RequestRejectedError(f"request id {request.request_id!r} is already in use")
        validate_request(request, self.vocab_size)
        check_fits(request, self.config.max_model_len, self.block_size, self.num_blocks)
        check_beam_fits(request, self.config.max_num_seqs, self.block_size, self.num_blocks)

    def stats(self) -> SchedulerStats:
        num_free = self.kv.num_free_blocks
        applier = self._applier
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_free_blocks=num_free,
            num_total_blocks=self.num_blocks,
            kv_usage=1.0 - num_free / self.num_blocks,
            prefix_cache_queries=self._planner.num_prefix_cache_queries,
            prefix_cache_hits=self._planner.num_prefix_cache_hits,
            num_preemptions=self._sets.num_preemptions,
            num_finished=self._sets.num_finished,
            num_aborted=self._num_aborted,
            num_steps=applier.num_steps,
            spec_num_drafts=applier.num_drafts,
            spec_num_draft_tokens=applier.num_draft_tokens,
            spec_num_accepted_tokens=applier.num_accepted_tokens,
        )

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant: of the request sets, then
        of the KV cache beneath them. O(blocks + requests)."""
        self._sets.check_integrity(self.config.max_num_seqs)
