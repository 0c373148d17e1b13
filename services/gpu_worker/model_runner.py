"""The model runner: applies step plans to its sequence table, runs one forward over every
scheduled token and samples on rank 0.

`execute(plan)` is the whole contract: drop finished and preempted sequences, add new ones
(full state), apply deltas to cached ones, compute `token_ids[num_computed : num_computed +
num_scheduled]` of every scheduled sequence in one packed batch, and sample each sequence whose
step reaches its last known token. Rank 0 returns a `StepResult` in plan order (new_seqs, then
cached_seqs, sampled ones only); other ranks return None. A sequence planned with
`keep_sample` gets its sample appended to its tokens here (async scheduling: the next plan may
already run on it; only with one rank, as only rank 0 samples).

A step that fails (`forget_failed`) takes its sequences with it: the scheduler fails them, and
a plan it made before it heard (async scheduling) may still name them; they sit that plan out
instead of failing it for every other sequence.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedserve.services.gpu_worker.attention.base import (
    AttentionMetadata,
    build_attention_metadata,
)
from pagedserve.services.gpu_worker.attention.selector import get_attention_backend_cls
from pagedserve.services.gpu_worker.default_model import ensure_model
from pagedserve.services.gpu_worker.grammar_book import GrammarBook, StepMasks
from pagedserve.services.gpu_worker.grammar_compiler import GrammarCompiler
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout, copy_blocks
from pagedserve.services.gpu_worker.layers.argmax import Argmax
from pagedserve.services.gpu_worker.model_loader import load_model
from pagedserve.services.gpu_worker.parallel_state import get_tp_rank, get_tp_world_size
from pagedserve.services.gpu_worker.platforms import get_platform, resolve_dtype
from pagedserve.services.gpu_worker.platforms.base import KVSizing
from pagedserve.services.gpu_worker.prompt_logprobs import (
    PromptSlice,
    collect_prompt_logprobs,
    prompt_slice,
)
from pagedserve.services.gpu_worker.sampler import AllowedTokens, SamplingRow, sample
from pagedserve.services.gpu_worker.sequence_state import SequenceState
from pagedserve.services.gpu_worker.speculation import verify_drafts
from pagedserve.services.gpu_worker.warmup import AttentionShape, layer_masks
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.model_facts import length_limit
from pagedserve.shared.protocol import PromptLogprobs, StepPlan, StepResult


def model_len_limit(config: Any) -> int:
    """The longest sequence the model handles exactly, by the rule every service uses
    (`shared.model_facts.length_limit`: the position limit, capped at a sliding window)."""
    fields = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    limit = length_limit(fields)
    if limit is None:
        raise ValueError("the model's config.json states no max_position_embeddings")
    return limit


@dataclass(frozen=True, slots=True)
class _StepInputs:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    sampled: list[SequenceState]
    sample_index: torch.Tensor  # [S] rows of the hidden states to sample from
    prompt_slices: list[PromptSlice]  # rows that predict prompt tokens (prompt_logprobs)
    # rows after each draft token, of the sampled sequences that have drafts, in order
    draft_index: torch.Tensor | None


class ModelRunner:
    """One rank's model, KV cache and sequence table. Call `init_tensor_parallel` first when
    world size > 1."""

    def __init__(
        self,
        model: str | Path,
        cache_config: CacheConfig | None = None,
        max_model_len: int | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        attention_backend: str = "auto",
        max_num_batched_tokens: int | None = None,
        show_progress: bool = True,
        max_num_seqs: int | None = None,
    ) -> None:
        cache_config = cache_config or CacheConfig()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.platform = get_platform(self.device)
        self.rank, self.world_size = get_tp_rank(), get_tp_world_size()
        self.platform.set_up_process(self.rank, self.world_size)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model_dir = ensure_model(model)  # converts the default model on first use
        backend_cls = get_attention_backend_cls(attention_backend, self.device)
        self.attention_backend = backend_cls.name
        self.model = load_model(
            self.model_dir, backend_cls, self.dtype, self.device, show_progress and self.rank == 0
        )
        self.forward_pass = self.platform.forward_pass(self.model)
        self.argmax = Argmax(self.platform.op_form)
        config = self.model.config
        self.vocab_size = config.vocab_size
        # each layer's window, as the scheduler learns it from the hello
        self.sliding_windows = [spec.sliding_window for spec in self.model.kv_cache_specs()]
        self.max_model_len = min(max_model_len or model_len_limit(config), model_len_limit(config))
        self.block_size = cache_config.block_size or self.platform.default_block_size()
        # the step size the CUDA memory profile is run at; the scheduler adopts it when it
        # was given none
        self.max_num_batched_tokens = (
            max_num_batched_tokens
            or self.platform.default_max_num_batched_tokens(self.forward_pass)
        )
        # n-gram drafts per sequence the scheduler uses when given no number (rank 0's hello)
        self.num_speculative_tokens = self.platform.default_num_speculative_tokens()
        # the sampler rows of the worst step the memory profile runs
        self.max_num_seqs = max_num_seqs or SchedulerConfig().max_num_seqs
        layout = KVCacheLayout.from_specs(
            self.model.kv_cache_specs(), self.block_size, self.model.num_kv_heads,
            self.model.head_dim, self.dtype,
        )  # fmt: skip
        self.num_blocks = cache_config.num_blocks
        if self.num_blocks is None:
            sizing = KVSizing(self.model, layout, cache_config, self.max_num_batched_tokens,
                              self.max_num_seqs, self.max_model_len)  # fmt: skip
            self.num_blocks = self.platform.num_kv_blocks(sizing)
        self.kv_caches = layout.allocate(self.num_blocks, self.device)
        self.seqs: dict[str, SequenceState] = {}
        self.failed_seq_ids: set[str] = set()  # dropped by a failed step (`forget_failed`)
        self.grammars = GrammarBook(GrammarCompiler(self.model_dir, self.vocab_size))
        self.platform.warm_up(self.kv_caches, self.triton_attention_shape(), self.vocab_size)

    def triton_attention_shape(self) -> AttentionShape | None:
        """This rank's attention geometry when the Triton kernels serve it, else None."""
        attn = self.model.layers[0].self_attn
        if self.attention_backend != "triton" or attn.attn.name != "triton":
            return None  # (MLA layers attend through the torch backend)
        masks = dict.fromkeys(layer_masks(layer.self_attn.attn) for layer in self.model.layers)
        return AttentionShape(
            attn.num_heads, attn.num_kv_heads, attn.head_dim, self.block_size, tuple(masks)
        )

    # ------------------------------------------------------------------ steps

    def drop_all(self) -> None:
        """Forget every sequence: the scheduler starts a new epoch from empty state."""
        self.seqs.clear()
        self.failed_seq_ids.clear()

    def forget_failed(self, plan: StepPlan) -> None:
        """`execute(plan)` raised: drop the plan's sequences (their state may be half-applied)
        and skip them in plans already made (see the module docstring)."""
        for seq in (*plan.new_seqs, *plan.cached_seqs):
            self.seqs.pop(seq.seq_id, None)
            self.failed_seq_ids.add(seq.seq_id)
        self.grammars.drop([s.seq_id for s in (*plan.new_seqs, *plan.cached_seqs)])

    def _apply_plan(self, plan: StepPlan) -> list[SequenceState]:
        gone = [*plan.finished_seq_ids, *plan.preempted_seq_ids]
        for seq_id in gone:
            self.seqs.pop(seq_id, None)
        self.grammars.drop(gone)
        self.failed_seq_ids.difference_update(gone)
        scheduled: list[SequenceState] = []
        for new in plan.new_seqs:
            self.failed_seq_ids.discard(new.seq_id)
            state = SequenceState.from_new(new)
            self.seqs[new.seq_id] = state
            if self.rank == 0:
                self.grammars.track(new.seq_id, new.sampling)
            scheduled.append(state)
        for delta in plan.cached_seqs:
            if delta.seq_id in self.failed_seq_ids:
                continue
            state = self.seqs.get(delta.seq_id)
            if state is None:
                raise ValueError(f"step {plan.step_id}: unknown cached sequence {delta.seq_id}")
            state.apply(delta)
            scheduled.append(state)
        for state in scheduled:
            state.validate(self.block_size, self.max_model_len)
        return scheduled

    def _prepare(self, scheduled: list[SequenceState]) -> tuple[_StepInputs, AttentionMetadata]:
        token_ids: list[int] = []
        positions: list[int] = []
        sampled: list[SequenceState] = []
        sample_rows: list[int] = []
        draft_rows: list[int] = []
        prompt_slices: list[PromptSlice] = []
        for state in scheduled:
            piece = prompt_slice(
                state.prompt_logprobs, state.token_ids, state.num_computed_tokens,
                state.num_scheduled_tokens, len(token_ids),
            )  # fmt: skip
            if piece is not None:
                prompt_slices.append(piece)
            token_ids.extend(state.scheduled_token_ids())
            positions.extend(range(state.num_computed_tokens, state.seq_len_after_step))
            if state.is_sampled:
                sampled.append(state)
                # the last known token's row; each draft's row follows it
                last_known = len(token_ids) - 1 - len(state.draft_token_ids)
                sample_rows.append(last_known)
                draft_rows.extend(range(last_known + 1, len(token_ids)))
        metadata = build_attention_metadata(
            [s.seq_len_after_step for s in scheduled],
            [s.num_scheduled_tokens for s in scheduled],
            [s.block_ids for s in scheduled],
            self.block_size,
            self.device,
        )
        inputs = _StepInputs(
            token_ids=torch.tensor(token_ids, dtype=torch.long, device=self.device),
            positions=torch.tensor(positions, dtype=torch.long, device=self.device),
            sampled=sampled,
            sample_index=torch.tensor(sample_rows, dtype=torch.long, device=self.device),
            prompt_slices=prompt_slices,
            draft_index=(
                torch.tensor(draft_rows, dtype=torch.long, device=self.device)
                if draft_rows
                else None
            ),
        )
        return inputs, metadata

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult | None:
        """Run one step plan; see the module docstring."""
        start = time.perf_counter()
        scheduled = self._apply_plan(plan)
        copy_blocks(self.kv_caches, plan.block_copies)  # before the step writes into them
        if not scheduled:
            return StepResult(plan.step_id, [], []) if self.rank == 0 else None
        inputs, metadata = self._prepare(scheduled)
        masks = self._start_masks(inputs.sampled)  # on a thread, while the forward runs
        rows = inputs.sample_index
        if inputs.draft_index is not None:
            rows = torch.cat([rows, inputs.draft_index])
        hidden = self._forward(inputs, metadata, rows)
        if inputs.prompt_slices:  # every rank: computing logits gathers over ranks
            collect_prompt_logprobs(hidden, inputs.prompt_slices, self.model.compute_logits)
        if not inputs.sampled:  # every rank sees the same plan, so all skip the gather
            return StepResult(plan.step_id, [], []) if self.rank == 0 else None
        logits = self.model.compute_logits(hidden[rows])  # all ranks: gather
        if self.rank != 0 or logits is None:
            return None
        num_sampled = len(inputs.sampled)
        result = self._sample(
            plan.step_id, logits[:num_sampled], inputs.sampled, masks and masks.result()
        )
        if inputs.draft_index is not None:
            result = verify_drafts(result, logits[num_sampled:], inputs.sampled)
        return dataclasses.replace(result, execute_time_s=time.perf_counter() - start)

    def _forward(
        self, inputs: _StepInputs, metadata: AttentionMetadata, rows: torch.Tensor
    ) -> torch.Tensor:
        """The step's final hidden states: of `rows` alone where the forward pass takes them
        (the others' last layer stops after attention), of every row where prompt logprobs
        read them all."""
        args = (inputs.token_ids, inputs.positions, self.kv_caches, metadata)
        if inputs.prompt_slices or not getattr(self.forward_pass, "takes_logit_rows", False):
            return self.forward_pass(*args)
        return self.forward_pass(*args, logit_rows=rows)

    def _start_masks(self, sampled: list[SequenceState]) -> Future[StepMasks] | None:
        if self.rank != 0 or not len(self.grammars):
            return None
        return self.grammars.start_masks(
            [(s.seq_id, s.token_ids[s.num_prompt_tokens :]) for s in sampled]
        )

    def _sample(
        self,
        step_id: int,
        logits: torch.Tensor,  # [S, V]
        sampled: list[SequenceState],
        masks: StepMasks | None,
    ) -> StepResult:
        """Sample every row whose grammar (if any) is ready; report the others."""
        allowed = None
        deferred: list[str] = []
        errors: dict[str, str] = {}
        if masks is not None:
            unready = {*masks.deferred_rows, *masks.row_errors}
            keep = [i for i in range(len(sampled)) if i not in unready]
            new_row = {old: new for new, old in enumerate(keep)}
            if masks.bitmask is not None:
                allowed = AllowedTokens([new_row[r] for r in masks.row_ids], masks.bitmask)
            if unready:  # a copy of the logits only when some rows sit this step out
                logits = logits[torch.tensor(keep, dtype=torch.long, device=logits.device)]
            deferred = [sampled[i].seq_id for i in masks.deferred_rows]
            errors = {sampled[i].seq_id: why for i, why in masks.row_errors.items()}
            sampled = [sampled[i] for i in keep]
        rows = [
            SamplingRow(
                s.sampling, s.token_ids[: s.num_prompt_tokens], s.token_ids[s.num_prompt_tokens :]
            )
            for s in sampled
        ]
        out = sample(logits, rows, allowed, self.argmax) if rows else None
        if out is not None:
            for state, token_id in zip(sampled, out.token_ids, strict=True):
                if state.keep_sample:
                    state.token_ids.append(token_id)
        return StepResult(
            step_id=step_id,
            seq_ids=[s.seq_id for s in sampled],
            token_ids=out.token_ids if out else [],
            logprobs=out.logprobs if out else None,
            top_logprobs=out.top_logprobs if out else None,
            prompt_logprobs=_take_prompt_logprobs(sampled),
            deferred_seq_ids=deferred,
            seq_errors=errors,
        )


def _take_prompt_logprobs(sampled: list[SequenceState]) -> list[PromptLogprobs | None] | None:
    """Per sampled sequence, its whole prompt's logprobs the first time it samples."""
    taken = [s.prompt_logprobs.take() if s.prompt_logprobs else None for s in sampled]
    return taken if any(t is not None for t in taken) else None
