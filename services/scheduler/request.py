"""The scheduler's state for one request (== one sequence: seq_id is the request id)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from pagedserve.shared.config import MAX_SPECULATIVE_TOKENS
from pagedserve.shared.protocol import GenerateRequest, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """Tokens, progress and timeline of one request.

    `num_computed_tokens` counts tokens whose KV is cached or scheduled to be computed (it is
    advanced when a step is planned, as in vLLM, so a second plan never recomputes them).
    `num_sent_tokens` / `num_sent_blocks` count what the workers already hold, so a plan sends
    only what changed.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int
    arrival_time: float
    arrival_index: int  # tie-breaker: order of acceptance by this scheduler
    gateway_id: str = ""
    cache_salt: str | None = None  # prefix-cache namespace, hashed into the first block
    sample_group: str | None = None  # the n parallel samples of one prompt share this
    all_token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first scheduling; -1: not yet scheduled
    num_sent_tokens: int = 0
    num_sent_blocks: int = 0
    status: RequestStatus = RequestStatus.WAITING
    scheduled_step_id: int = -1  # the last plan that scheduled it
    num_draft_tokens: int = 0  # speculative tokens that plan also computed (in num_computed)
    # drafts it may have next time: one more than its last drafts' accepted run (speculation.py)
    max_next_drafts: int = MAX_SPECULATIVE_TOKENS
    # plans whose sample of it the worker keeps (`keep_sample`), oldest first, until their
    # results are applied: with async scheduling, the next plan may already compute on it
    kept_sample_steps: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # chained digests of full blocks
    # beam search: the client's request id this sequence is a beam of (beam_groups.py)
    beam_group_id: str | None = None
    # the workers must get it in full next time (a beam forked, or its table rewritten)
    needs_full_send: bool = False
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None

    @classmethod
    def from_generate(cls, request: GenerateRequest, arrival_index: int, now: float) -> Request:
        return cls(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling=request.sampling,
            priority=request.priority,
            arrival_time=request.arrival_time or now,
            arrival_index=arrival_index,
            gateway_id=request.gateway_id,
            cache_salt=request.cache_salt,
            sample_group=request.sample_group,
            all_token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
        )

    def fork(self, request_id: str) -> Request:
        """A copy of this sequence under a new id, sharing its computed prefix (a new beam):
        the same tokens, progress and block digests; nothing sent to the workers yet."""
        return dataclasses.replace(
            self,
            request_id=request_id,
            all_token_ids=list(self.all_token_ids),
            block_hashes=list(self.block_hashes),
            num_sent_tokens=0,
            num_sent_blocks=0,
            kept_sample_steps=[],
            needs_full_send=True,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]
