"""Rank 0's grammar state: one xgrammar matcher per constrained sequence, and the token masks
of each step, computed on a thread while the model runs its forward pass.

A matcher is never told about a token it has not seen in a plan: before each step it consumes
the sequence's outputs that it has not consumed yet (the last step's sample arrives in the
next plan's delta). So a sequence re-sent in full (after preemption, or recomputed) simply gets
a fresh matcher that catches up over its outputs, and tokens that never reach a plan (a stop
token, a sample dropped by an abort) never reach a matcher.

A row whose grammar is still compiling is deferred (not sampled this step; the scheduler runs
its last token again); a row whose grammar failed to compile, or whose output left its
grammar, cannot be sampled and is reported with the reason."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from pagedserve.services.gpu_worker.grammar_compiler import GrammarCompiler
from pagedserve.shared.protocol import SamplingParams, StructuredOutput

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GrammarSlot:
    """One constrained sequence: its compiled grammar (maybe not yet) and its matcher."""

    spec: StructuredOutput
    compiled: Future[Any]
    stop_token_ids: list[int]  # the tokens that end the output once the grammar is complete
    matcher: Any = None  # xgrammar.GrammarMatcher, once `compiled` is done
    num_accepted: int = 0  # outputs the matcher has consumed
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepMasks:
    """The masks of one step's sampled rows."""

    row_ids: list[int]  # rows that are constrained and ready
    bitmask: torch.Tensor | None  # [len(row_ids), ceil(V / 32)] int32, xgrammar's layout
    deferred_rows: list[int] = field(default_factory=list)  # grammar still compiling
    row_errors: dict[int, str] = field(default_factory=dict)  # cannot be sampled: why


class GrammarBook:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._slots: dict[str, GrammarSlot] = {}
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._batch_matcher: Any = None

    def track(self, seq_id: str, sampling: SamplingParams) -> None:
        """A sequence arrived in full: (re)start its grammar state."""
        self._slots.pop(seq_id, None)
        spec = sampling.structured_output
        if spec is None:
            return
        stop_ids = list(dict.fromkeys((*sampling.eos_token_ids, *sampling.stop_token_ids)))
        self._slots[seq_id] = GrammarSlot(spec, self.compiler.compile(spec), stop_ids)

    def drop(self, seq_ids: list[str]) -> None:
        for seq_id in seq_ids:
            self._slots.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._slots)

    def start_masks(self, seq_outputs: list[tuple[str, list[int]]]) -> Future[StepMasks] | None:
        """Start computing the masks of the sampled rows, given as (seq_id, output token ids)
        in row order; None when no row is constrained."""
        rows = [
            (i, self._slots[seq_id], outputs)
            for i, (seq_id, outputs) in enumerate(seq_outputs)
            if seq_id in self._slots
        ]
        if not rows:
            return None
        return self._filler.submit(self._masks, rows)

    def shutdown(self) -> None:
        self._filler.shutdown(wait=False, cancel_futures=True)
        self.compiler.shutdown()

    def _masks(self, rows: list[tuple[int, GrammarSlot, list[int]]]) -> StepMasks:
        import xgrammar

        ready_rows: list[int] = []
        matchers: list[Any] = []
        deferred: list[int] = []
        errors: dict[int, str] = {}
        for row, slot, outputs in rows:
            if not self._catch_up(slot, outputs):
                if slot.error is None:
                    deferred.append(row)
                else:
                    errors[row] = slot.error
                continue
            ready_rows.append(row)
            matchers.append(slot.matcher)
        if not matchers:
            return StepMasks([], None, deferred, errors)
        bitmask = xgrammar.allocate_token_bitmask(len(matchers), self.compiler.vocab_size)
        if self._batch_matcher is None:
            self._batch_matcher = xgrammar.BatchGrammarMatcher(max_threads=1)
        self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask)
        return StepMasks(ready_rows, bitmask, deferred, errors)

    def _catch_up(self, slot: GrammarSlot, outputs: list[int]) -> bool:
        """Bring the matcher up to date with `outputs`; False when it cannot mask this step
        (still compiling, or `slot.error` says why never)."""
        if slot.error is not None:
            return False
        if slot.matcher is None:
            if not slot.compiled.done():
                return False
            exc = slot.compiled.exception()
            if exc is not None:
                slot.error = str(exc)
                return False
            slot.matcher = _new_matcher(slot.compiled.result(), slot.stop_token_ids)
        for token_id in outputs[slot.num_accepted :]:
            if slot.matcher.is_terminated() or not slot.matcher.accept_token(token_id):
                slot.error = f"output token {token_id} breaks its {slot.spec.kind} constraint"
                return False
            slot.num_accepted += 1
        if slot.matcher.is_terminated():
            slot.error = f"the output completed its {slot.spec.kind} constraint"
            return False
        return True


def _new_matcher(compiled: Any, stop_token_ids: list[int]) -> Any:
    import xgrammar

    return xgrammar.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids or None)
