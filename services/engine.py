"""`LLMEngine`: the scheduler core and one model runner in one process, for offline
generation, tests and benchmarks. No Redis, no ZeroMQ: `step()` is schedule -> execute ->
update_from_output, exactly the loop the scheduler process runs against remote workers."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedserve.services.gpu_worker.cpu_threads import ThreadGovernor
from pagedserve.services.gpu_worker.default_model import ensure_model
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.scheduler.engine_shape import EngineShape
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.model_facts import read_model_facts
from pagedserve.shared.protocol import (
    BeamOutput,
    GenerateRequest,
    SamplingParams,
    TokenDelta,
    WorkerHello,
)

MAX_IDLE_STEPS = 100  # empty plans in a row with work waiting: a scheduler that is stuck


@dataclass(slots=True)
class GenerationResult:
    """Everything one request produced, assembled from its deltas."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    text: str | None = None  # decoded output, when the engine has a tokenizer
    beams: list[BeamOutput] | None = None  # beam search: the n best, best first

    def add(self, delta: TokenDelta) -> None:
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        if delta.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + delta.top_logprobs
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        if delta.beams is not None:
            self.beams = delta.beams
        if delta.finished:
            self.finish_reason, self.error = delta.finish_reason, delta.error


class LLMEngine:
    def __init__(
        self,
        model: str | Path,
        scheduler_config: SchedulerConfig | None = None,
        cache_config: CacheConfig | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | None = None,
        attention_backend: str = "auto",
        show_progress: bool = False,
    ) -> None:
        scheduler_config = scheduler_config or SchedulerConfig()
        cache_config = cache_config or CacheConfig()
        self.model_dir = ensure_model(model)
        self.runner = ModelRunner(
            self.model_dir,
            cache_config,
            max_model_len=scheduler_config.max_model_len,
            dtype=dtype,
            device=device,
            attention_backend=attention_backend,
            max_num_batched_tokens=scheduler_config.max_num_batched_tokens,
            show_progress=show_progress,
        )
        # the CPU thread count chosen at start (from the load average then) is re-chosen while
        # it steps, as the worker's is: a run started just after other work would otherwise
        # keep one thread on an idle machine for good
        self.thread_governor = ThreadGovernor.for_worker(self.runner.device, world_size=1)
        self.shape = EngineShape.derive([self._hello()], scheduler_config, cache_config)
        self.scheduler = Scheduler(
            self.shape.scheduler_config(scheduler_config),
            self.shape.cache_config(cache_config),
            vocab_size=self.shape.vocab_size,
        )
        self.tokenizer = self._load_tokenizer()
        # The end tokens by the rule the gateway and worker use (`shared.model_facts`).
        self.eos_token_ids = read_model_facts(self.model_dir).eos_token_ids
        self._ids = itertools.count()
        self._last_plan_ran = False

    def _hello(self) -> WorkerHello:
        """What the runner would tell a scheduler process: the engine's shape derives from it."""
        runner = self.runner
        return WorkerHello(
            rank=0,
            world_size=1,
            num_blocks=runner.num_blocks,
            block_size=runner.block_size,
            max_model_len=runner.max_model_len,
            model=str(self.model_dir),
            max_num_batched_tokens=runner.max_num_batched_tokens,
            vocab_size=runner.vocab_size,
            sliding_windows=runner.sliding_windows,
            num_speculative_tokens=runner.num_speculative_tokens,
        )

    def _load_tokenizer(self) -> Any | None:
        if (
            not (self.model_dir / "tokenizer.json").is_file()
            and not (self.model_dir / "tokenizer_config.json").is_file()
        ):
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_dir)

    # ------------------------------------------------------------------ requests

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    f"{self.model_dir} has no tokenizer: pass prompts as token id lists"
                )
            return list(self.tokenizer.encode(prompt))
        return list(prompt)

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request; empty `eos_token_ids` are filled with the model's own."""
        if not request.sampling.eos_token_ids and self.eos_token_ids:
            sampling = dataclasses.replace(request.sampling, eos_token_ids=self.eos_token_ids)
            request = dataclasses.replace(request, sampling=sampling)
        self.scheduler.add_request(request)

    def step(self) -> list[TokenDelta]:
        """One scheduling step and its forward; the deltas it produced."""
        if self.thread_governor is not None:
            self.thread_governor.poll()
        plan = self.scheduler.schedule()
        self._last_plan_ran = not plan.is_empty
        if plan.is_empty:
            # Finished/preempted ids still have to reach the runner so it drops their state.
            self.runner.execute(plan)
            return []
        result = self.runner.execute(plan)
        assert result is not None  # a single-process engine is rank 0
        return self.scheduler.update_from_output(plan, result)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, so that a rerun of the same prompts computes them again
        (a benchmark's runs stay comparable). Raises ValueError while requests are unfinished."""
        self.scheduler.reset_prefix_cache()

    def _add_all(
        self, prompts: list[str] | list[list[int]], params: list[SamplingParams]
    ) -> dict[str, GenerationResult]:
        """Queue every prompt, or none: if one is rejected, those already queued are aborted
        (they would otherwise run in the next call) and the error is raised."""
        results: dict[str, GenerationResult] = {}
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                request_id = f"gen-{next(self._ids)}"
                token_ids = self.encode(prompt)
                self.add_request(GenerateRequest(request_id, token_ids, sp))
                results[request_id] = GenerationResult(request_id, token_ids)
        except Exception:
            self.scheduler.abort_requests(list(results), "a later prompt was rejected")
            raise
        return results

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """Run every prompt to completion as one continuous batch; results in prompt order."""
        sampling = sampling or SamplingParams()
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        results = self._add_all(prompts, params)
        num_idle_steps = 0
        while self.has_unfinished_requests():
            deltas = self.step()
            num_idle_steps = 0 if deltas or self._last_plan_ran else num_idle_steps + 1
            if num_idle_steps > MAX_IDLE_STEPS:
                raise RuntimeError(
                    f"the scheduler scheduled nothing for {MAX_IDLE_STEPS} steps with "
                    f"{self.scheduler.stats()} unfinished: it cannot make progress"
                )
            for delta in deltas:
                if delta.request_id in results:
                    results[delta.request_id].add(delta)
        if self.tokenizer is not None:
            for result in results.values():
                text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                # an output cut inside a multi-byte character ends in U+FFFD, which the model
                # never wrote: dropped, as the gateway (and vLLM) hold those bytes back
                result.text = text.rstrip("\ufffd")
        return list(results.values())
