"""Warm-up before a worker says ready: every Triton kernel variant the `triton` backend can
launch runs once (counted through a seam on the kernels, under the interpreter), the sampler
runs once, and the memory profile's worst step samples max_num_seqs rows of full-vocabulary
fp32 logits after a prefill of the token budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import pagedserve.services.gpu_worker.warmup as warmup
from pagedserve.kernels import kv_cache_write, paged_decode, paged_prefill
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.sampler import MAX_LOGPROBS, sample
from pagedserve.services.gpu_worker.warmup import (
    AttentionShape,
    LayerMasks,
    run_worst_step,
    split_count_classes,
)
from pagedserve.shared.config import CacheConfig
from tests.fixtures.tiny_models import build_tiny_model
from tests.kernels.launch_recorder import LaunchRecorder

SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=16, block_size=16)
KERNELS = {
    "write": (kv_cache_write, "kv_cache_write_kernel"),
    "decode": (paged_decode, "paged_decode_kernel"),
    "reduce": (paged_decode, "paged_decode_reduce_kernel"),
    "prefill": (paged_prefill, "paged_prefill_kernel"),
}


@pytest.fixture
def recorders(monkeypatch: pytest.MonkeyPatch) -> dict[str, LaunchRecorder]:
    out = {}
    for name, (module, attr) in KERNELS.items():
        out[name] = LaunchRecorder(getattr(module, attr))
        monkeypatch.setattr(module, attr, out[name])
    return out


@pytest.fixture
def sampler_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, list]]:
    calls: list[tuple[torch.Tensor, list]] = []

    def recording_sample(logits: torch.Tensor, rows: list) -> object:
        calls.append((logits, rows))
        return sample(logits, rows)

    monkeypatch.setattr(warmup, "sample", recording_sample)
    return calls


def test_split_count_classes_cover_every_reduce_variant() -> None:
    assert split_count_classes(32) == [2, 4, 8, 16, 32]
    assert split_count_classes(24) == [2, 4, 8, 16, 24]
    assert split_count_classes(2) == [2]


def test_warm_up_launches_every_kernel_variant_once(
    recorders: dict[str, LaunchRecorder], sampler_calls: list
) -> None:
    cache = torch.zeros(4, SHAPE.block_size, SHAPE.num_kv_heads, SHAPE.head_dim)
    seconds = warmup.warm_up([(cache, cache.clone())], SHAPE, 64, torch.device("cpu"))
    splits = split_count_classes(paged_decode.MAX_SPLITS)
    assert list(seconds) == [
        "kv write",
        "prefill",
        "decode",
        *(f"decode split {n}" for n in splits),
        "sampler",
    ]
    assert len(recorders["write"].grids) == 1
    assert recorders["prefill"].values_of("FLAT_GRID") == [True]
    # one single-pass decode, then the split pass once per reduce variant
    assert recorders["decode"].values_of("SPLIT") == [False] + [True] * len(splits)
    assert recorders["reduce"].values_of("SPLITS_PAD") == [2, 4, 8, 16, 32]
    assert len(sampler_calls) == 1


def test_warm_up_launches_each_layer_masks_variants(
    recorders: dict[str, LaunchRecorder], sampler_calls: list
) -> None:
    """GPT-OSS: windowed and full layers, both with sinks: each mask's variants compile."""
    masks = (LayerMasks(24, None, torch.float32), LayerMasks(None, None, torch.float32))
    shape = dataclasses.replace(SHAPE, layer_masks=masks)
    cache = torch.zeros(4, SHAPE.block_size, SHAPE.num_kv_heads, SHAPE.head_dim)
    seconds = warmup.warm_up([(cache, cache.clone())], shape, 64, torch.device("cpu"))
    splits = split_count_classes(paged_decode.MAX_SPLITS)
    assert "decode split 2 (window 24, sinks)" in seconds and "prefill (sinks)" in seconds
    assert recorders["prefill"].values_of("WINDOWED") == [True, False]
    assert recorders["prefill"].values_of("SINKS") == [True, True]
    assert recorders["decode"].values_of("WINDOWED") == [True] * (1 + len(splits)) + [False] * (
        1 + len(splits)
    )
    assert recorders["reduce"].values_of("SINKS") == [True] * 2 * len(splits)


def test_the_runner_lists_each_distinct_layer_masks(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "gpt_oss", "gpt_oss")
    runner = ModelRunner(
        model_dir, CacheConfig(block_size=16, num_blocks=8), dtype="float32",
        attention_backend="triton", show_progress=False,
    )  # fmt: skip
    assert runner.triton_attention_shape().layer_masks == (
        LayerMasks(24, None, torch.float32),
        LayerMasks(None, None, torch.float32),
    )


def test_warm_up_without_the_triton_backend_runs_only_the_sampler(
    recorders: dict[str, LaunchRecorder], sampler_calls: list
) -> None:
    cache = torch.zeros(4, SHAPE.block_size, SHAPE.num_kv_heads, SHAPE.head_dim)
    seconds = warmup.warm_up([(cache, cache)], None, 64, torch.device("cpu"))
    assert list(seconds) == ["sampler"]
    assert all(not r.grids for r in recorders.values())
    assert len(sampler_calls) == 1


def test_sampler_rows_take_every_branch() -> None:
    rows = warmup.sampler_rows(8, 100)
    params = [r.params for r in rows]
    assert any(p.is_greedy for p in params) and any(not p.is_greedy for p in params)
    assert any(p.logprobs == MAX_LOGPROBS for p in params)
    assert any(p.repetition_penalty != 1.0 and p.top_k > 0 and p.top_p < 1 for p in params)
    assert any(p.seed is not None for p in params) and any(p.seed is None for p in params)
    assert any(p.min_tokens > 0 for p in params)
    assert any(p.logit_bias for p in params)


@pytest.mark.parametrize(("num_tokens", "max_num_seqs"), [(40, 16), (12, 64)])
def test_worst_step_samples_max_num_seqs_rows_of_the_full_vocabulary(
    tiny_llama_dir: Path, sampler_calls: list, num_tokens: int, max_num_seqs: int
) -> None:
    runner = ModelRunner(
        tiny_llama_dir,
        CacheConfig(block_size=4, num_blocks=16),
        dtype="float32",
        show_progress=False,
    )
    run_worst_step(runner.model, runner.kv_caches, num_tokens, max_num_seqs, 4, torch.device("cpu"))
    ((logits, rows),) = sampler_calls
    assert logits.shape == (max_num_seqs, runner.vocab_size)
    assert logits.dtype == torch.float32
    assert len(rows) == max_num_seqs


def test_runner_reports_the_triton_shape_only_for_the_triton_backend(tiny_llama_dir: Path) -> None:
    def runner(backend: str) -> ModelRunner:
        return ModelRunner(
            tiny_llama_dir,
            CacheConfig(block_size=16, num_blocks=4),
            dtype="float32",
            attention_backend=backend,
            show_progress=False,
            max_num_seqs=8,
        )

    triton_runner = runner("triton")
    assert triton_runner.triton_attention_shape() == AttentionShape(4, 2, 16, 16)
    assert triton_runner.max_num_seqs == 8
    assert runner("torch").triton_attention_shape() is None


def test_a_warmed_up_triton_runner_serves_what_the_torch_runner_serves(
    tiny_llama_dir: Path,
) -> None:
    # Warm-up writes into the first blocks of the real cache and runs every kernel variant;
    # a sequence given those blocks afterwards generates what an unwarmed runner generates.
    from pagedserve.shared.protocol import CachedSequence, NewSequence, SamplingParams, StepPlan

    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def generate(backend: str, warm: bool) -> list[int]:
        runner = ModelRunner(
            tiny_llama_dir,
            CacheConfig(block_size=16, num_blocks=4),
            dtype="float32",
            attention_backend=backend,
            show_progress=False,
        )
        if warm:
            shape = runner.triton_attention_shape()
            warmup.warm_up(runner.kv_caches, shape, runner.vocab_size, torch.device("cpu"))
        prompt = list(range(3, 23))  # 20 tokens: blocks 0 and 1, which warm-up wrote
        plan = StepPlan(0, new_seqs=[NewSequence("a", prompt, 20, 0, 20, [0, 1], greedy)])
        tokens = runner.execute(plan).token_ids
        for step in range(1, 4):
            delta = CachedSequence("a", [tokens[-1]], [], 19 + step, 1)
            tokens += runner.execute(StepPlan(step, cached_seqs=[delta])).token_ids
        return tokens

    assert generate("triton", warm=True) == generate("torch", warm=False)
