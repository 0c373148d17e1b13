"""What a worker remembers of each sequence between step plans (the plan sends deltas)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.gpu_worker.prompt_logprobs import PromptLogprobsCollector
from pagedserve.shared.protocol import CachedSequence, NewSequence, SamplingParams


@dataclass(slots=True)
class SequenceState:
    seq_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    sampling: SamplingParams
    num_computed_tokens: int = 0
    num_scheduled_tokens: int = 0
    prompt_logprobs: PromptLogprobsCollector | None = None  # when the request asked for them
    # this step's speculative tokens, computed after token_ids and never kept
    draft_token_ids: list[int] = field(default_factory=list)
    keep_sample: bool = False  # append this step's sample to token_ids (async scheduling)

    @classmethod
    def from_new(cls, seq: NewSequence) -> SequenceState:
        return cls(
            seq_id=seq.seq_id,
            token_ids=list(seq.token_ids),
            num_prompt_tokens=seq.num_prompt_tokens,
            block_ids=list(seq.block_ids),
            sampling=seq.sampling,
            num_computed_tokens=seq.num_computed_tokens,
            num_scheduled_tokens=seq.num_scheduled_tokens,
            prompt_logprobs=(
                None
                if seq.sampling.prompt_logprobs is None
                else PromptLogprobsCollector(seq.num_prompt_tokens, seq.sampling.prompt_logprobs)
            ),
            keep_sample=seq.keep_sample,
        )

    def apply(self, delta: CachedSequence) -> None:
        self.token_ids.extend(delta.new_token_ids)
        self.block_ids.extend(delta.new_block_ids)
        self.num_computed_tokens = delta.num_computed_tokens
        self.num_scheduled_tokens = delta.num_scheduled_tokens
        self.draft_token_ids = delta.draft_token_ids
        self.keep_sample = delta.keep_sample

    @property
    def seq_len_after_step(self) -> int:
        return self.num_computed_tokens + self.num_scheduled_tokens

    @property
    def num_known_tokens(self) -> int:
        """Known tokens and this step's drafts."""
        return len(self.token_ids) + len(self.draft_token_ids)

    @property
    def is_sampled(self) -> bool:
        """This step reaches the last known token (and its drafts), so it produces the next
        one (after the last known token and after each draft)."""
        return self.seq_len_after_step == self.num_known_tokens

    def scheduled_token_ids(self) -> list[int]:
        tokens = self.token_ids + self.draft_token_ids if self.draft_token_ids else self.token_ids
        return tokens[self.num_computed_tokens : self.seq_len_after_step]

    def validate(self, block_size: int, max_model_len: int) -> None:
        """A plan that would read or write outside this sequence's blocks is a bug upstream."""
        end = self.seq_len_after_step
        if self.num_scheduled_tokens < 1 or end > self.num_known_tokens:
            raise ValueError(
                f"sequence {self.seq_id}: scheduled tokens [{self.num_computed_tokens}, {end}) "
                f"must be non-empty and within its {len(self.token_ids)} known tokens and "
                f"{len(self.draft_token_ids)} drafts"
            )
        if self.draft_token_ids and self.num_scheduled_tokens != len(self.draft_token_ids) + 1:
            raise ValueError(
                f"sequence {self.seq_id}: {len(self.draft_token_ids)} drafts must be computed "
                f"with the one known token before them, not {self.num_scheduled_tokens} tokens"
            )
        if end > len(self.block_ids) * block_size:
            raise ValueError(
                f"sequence {self.seq_id}: {end} tokens need {-(-end // block_size)} blocks, "
                f"its block table has {len(self.block_ids)}"
            )
        if end > max_model_len:
            raise ValueError(
                f"sequence {self.seq_id}: {end} tokens exceed max_model_len {max_model_len}"
            )
