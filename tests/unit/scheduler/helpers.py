"""Builders for scheduler tests, and a fake worker that checks plans against a simulated KV
cache: every slot remembers which token was written there, so a step that would read a
position whose KV is missing or was overwritten (a bad prefix hit, a block evicted while in
use) fails the test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pagedserve.services.gpu_worker.speculation import accepted
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import (
    CachedSequence,
    GenerateRequest,
    NewSequence,
    SamplingParams,
    StepPlan,
    StepResult,
)


def make_scheduler(
    num_blocks: int = 8,
    block_size: int = 4,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    max_waiting: int = 100,
    policy: str = "fcfs",
    enable_prefix_caching: bool = True,
    enable_chunked_prefill: bool = True,
    num_speculative_tokens: int | None = 0,
    speculative_max_num_seqs: int = 4,
    sliding_window: int | None = None,
    async_scheduling: bool = False,
    vocab_size: int = 0,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            max_waiting=max_waiting,
            policy=policy,
            enable_chunked_prefill=enable_chunked_prefill,
            num_speculative_tokens=num_speculative_tokens,
            speculative_max_num_seqs=speculative_max_num_seqs,
            async_scheduling=async_scheduling,
        ),
        CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            sliding_window=sliding_window,
        ),
        vocab_size=vocab_size,
    )


def make_request(
    request_id: str,
    prompt_token_ids: list[int] | int,
    max_tokens: int = 4,
    priority: int = 0,
    **sampling: object,
) -> GenerateRequest:
    if isinstance(prompt_token_ids, int):
        prompt_token_ids = [100 + i for i in range(prompt_token_ids)]
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling=SamplingParams(max_tokens=max_tokens, **sampling),
        priority=priority,
    )


@dataclass
class _SeqState:
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class FakeWorker:
    """Applies plans like a worker would and answers with hand-chosen tokens."""

    num_blocks: int
    block_size: int
    sliding_window: int | None = None  # a step reads only the window of its first token
    seqs: dict[str, _SeqState] = field(default_factory=dict)
    slots: dict[int, int] = field(default_factory=dict)  # slot -> token written there

    def execute(
        self, plan: StepPlan, next_token: Callable[[str], int] = lambda seq_id: 7
    ) -> StepResult:
        for seq_id in (*plan.finished_seq_ids, *plan.preempted_seq_ids):
            self.seqs.pop(seq_id, None)
        for new in plan.new_seqs:
            self.seqs[new.seq_id] = _SeqState(list(new.token_ids), list(new.block_ids))
        for cached in plan.cached_seqs:
            state = self.seqs[cached.seq_id]  # KeyError: a delta for a sequence never sent
            state.token_ids += cached.new_token_ids
            state.block_ids += cached.new_block_ids
        sampled, tokens = [], []
        for s in (*plan.new_seqs, *plan.cached_seqs):
            if self._compute(s.seq_id, s.num_computed_tokens, s.num_scheduled_tokens):
                sampled.append(s.seq_id)
                tokens.append(next_token(s.seq_id))
                self._keep(s, tokens[-1])
        return StepResult(plan.step_id, sampled, tokens)

    def _keep(self, seq: NewSequence | CachedSequence, token_id: int) -> None:
        """A sample the plan says the worker keeps is appended to its tokens (async
        scheduling), as the model runner does."""
        if seq.keep_sample:
            self.seqs[seq.seq_id].token_ids.append(token_id)

    def execute_model(self, plan: StepPlan, model: Callable[[list[int]], int]) -> StepResult:
        """As `execute`, for a deterministic "model" (the next token given all before it),
        checking draft tokens as the workers do (`services/gpu_worker/speculation.py`)."""
        for seq_id in (*plan.finished_seq_ids, *plan.preempted_seq_ids):
            self.seqs.pop(seq_id, None)
        for new in plan.new_seqs:
            self.seqs[new.seq_id] = _SeqState(list(new.token_ids), list(new.block_ids))
        drafts = {}
        for cached in plan.cached_seqs:
            state = self.seqs[cached.seq_id]
            state.token_ids += cached.new_token_ids
            state.block_ids += cached.new_block_ids
            drafts[cached.seq_id] = cached.draft_token_ids
        sampled, first, more = [], [], []
        for s in (*plan.new_seqs, *plan.cached_seqs):
            state = self.seqs[s.seq_id]
            draft = drafts.get(s.seq_id, [])
            tokens = state.token_ids + draft
            if self._compute(s.seq_id, s.num_computed_tokens, s.num_scheduled_tokens, tokens):
                known = len(state.token_ids)
                after = [model(tokens[: known + i]) for i in range(len(draft) + 1)]
                sampled.append(s.seq_id)
                first.append(after[0])
                more.append(accepted(draft, after[0], after[1:]))
                self._keep(s, after[0])
        return StepResult(plan.step_id, sampled, first, more_token_ids=more)

    def _compute(
        self, seq_id: str, num_computed: int, num_scheduled: int, tokens: list[int] | None = None
    ) -> bool:
        state = self.seqs[seq_id]
        tokens = state.token_ids if tokens is None else tokens
        end = num_computed + num_scheduled
        assert num_scheduled >= 1 and end <= len(tokens), (seq_id, num_computed, end)
        assert len(state.block_ids) * self.block_size >= end, f"{seq_id}: table too short"
        assert all(0 <= b < self.num_blocks for b in state.block_ids)
        first = 0 if self.sliding_window is None else max(0, num_computed - self.sliding_window + 1)
        for pos in range(first, num_computed):  # the context it attends to must be intact
            got = self.slots.get(self._slot(state, pos))
            assert got == tokens[pos], f"{seq_id}: KV at {pos} is {got}"
        for pos in range(num_computed, end):
            self.slots[self._slot(state, pos)] = tokens[pos]
        return end == len(tokens)

    def _slot(self, state: _SeqState, pos: int) -> int:
        return state.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size


def run_step(
    scheduler: Scheduler, worker: FakeWorker, next_token: Callable[[str], int] = lambda _: 7
) -> tuple[StepPlan, list]:
    plan = scheduler.schedule()
    scheduler.check_integrity()
    result = worker.execute(plan, next_token)
    deltas = scheduler.update_from_output(plan, result)
    scheduler.check_integrity()
    return plan, deltas
