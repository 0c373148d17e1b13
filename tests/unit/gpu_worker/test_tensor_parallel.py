"""TP=2 over gloo: two real processes run the same step plans; rank 0's samples must equal
transformers' greedy output (the plans feed HF's tokens back, as the scheduler would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.multiprocessing as mp

from pagedserve.services.cli.ports import free_port
from pagedserve.shared.protocol import CachedSequence, NewSequence, SamplingParams, StepPlan
from tests.fixtures.gloo_exit import leave_together
from tests.fixtures.hf_reference import hf_greedy, load_hf
from tests.fixtures.tiny_models import build_tiny_model

NUM_STEPS = 6
BLOCK_SIZE = 4


def build_plans(prompts: dict[str, list[int]], outputs: dict[str, list[int]]) -> list[StepPlan]:
    greedy = SamplingParams(temperature=0.0, logprobs=1)
    blocks, next_block = {}, 0
    for seq_id, prompt in prompts.items():
        num_blocks = -(-(len(prompt) + NUM_STEPS) // BLOCK_SIZE)
        blocks[seq_id] = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
    plans = [
        StepPlan(
            0,
            new_seqs=[
                NewSequence(s, p, len(p), 0, len(p), blocks[s], greedy) for s, p in prompts.items()
            ],
        )
    ]
    for step in range(1, NUM_STEPS):
        cached = [
            CachedSequence(s, [outputs[s][step - 1]], [], len(p) + step - 1, 1)
            for s, p in prompts.items()
        ]
        plans.append(StepPlan(step, cached_seqs=cached))
    return plans


def _worker(
    rank: int, port: int, model_dirs: list[str], plans_per_model: list, queue, exit_barrier
) -> None:
    from pagedserve.services.gpu_worker.model_runner import ModelRunner
    from pagedserve.services.gpu_worker.parallel_state import (
        destroy_tensor_parallel,
        init_tensor_parallel,
    )
    from pagedserve.shared.config import CacheConfig

    init_tensor_parallel(rank, 2, "127.0.0.1", port, backend="gloo")
    try:
        for model_dir, plans in zip(model_dirs, plans_per_model, strict=True):
            runner = ModelRunner(
                model_dir,
                CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
                dtype="float32",
                device="cpu",
                show_progress=False,
            )
            results = [runner.execute(plan) for plan in plans]
            if rank == 0:
                queue.put((model_dir, results))
            else:
                assert all(r is None for r in results)
        import torch.distributed as dist

        dist.barrier()
    except BaseException:
        destroy_tensor_parallel()
        raise
    leave_together(exit_barrier, queue)  # tests/fixtures/gloo_exit.py


@pytest.mark.slow
def test_tp2_over_gloo_matches_hf(tiny_llama_dir: Path, tmp_path: Path) -> None:
    # A model with one KV head also exercises KV-head replication across the two ranks.
    one_kv = build_tiny_model(tmp_path / "one-kv", "llama", seed=3, num_key_value_heads=1)
    # A dense model with a sliding window shorter than prompt "a": each rank attends its heads
    # within the window.
    windowed = build_tiny_model(tmp_path / "windowed", "mistral", seed=4, sliding_window=16)
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf([tiny_llama_dir, one_kv, windowed], prompts)


@pytest.mark.slow
def test_tp2_over_gloo_of_the_newer_dense_models_matches_hf(tmp_path: Path) -> None:
    """SmolLM3 (a layer without rotary embedding), EXAONE 4 (post-norms, q/k norms of each
    head, window layers and a NoPE full one), ERNIE 4.5 (q/k rows reordered at load, before
    each rank takes its heads): each rank with its half of the heads."""
    smollm3 = build_tiny_model(tmp_path / "smollm3", "smollm3", seed=5)
    exaone4 = build_tiny_model(tmp_path / "exaone4", "exaone4", seed=6, sliding_window=16)
    ernie = build_tiny_model(tmp_path / "ernie4_5", "ernie4_5", seed=7, use_bias=True)
    prompts = {"a": list(range(3, 40)), "b": [11], "c": list(range(200, 213))}
    check_tp2_matches_hf([smollm3, exaone4, ernie], prompts)


def check_tp2_matches_hf(model_dirs: list[Path], prompts: dict[str, list[int]]) -> None:
    """Each model's greedy tokens and logprobs at TP=2 over gloo equal transformers'."""
    plans_per_model, expected = [], {}
    for model_dir in model_dirs:
        hf = load_hf(model_dir)
        refs = {s: hf_greedy(hf, p, NUM_STEPS) for s, p in prompts.items()}
        assert all(r.num_trusted == NUM_STEPS for r in refs.values()), "near-tie in the fixture"
        outputs = {s: r.token_ids for s, r in refs.items()}
        plans_per_model.append(build_plans(prompts, outputs))
        expected[str(model_dir)] = (outputs, refs)
    dirs = [str(d) for d in model_dirs]
    ctx = mp.get_context("spawn")
    queue, exit_barrier = ctx.Queue(), ctx.Barrier(2)
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(rank, port, dirs, plans_per_model, queue, exit_barrier))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    got = dict(queue.get(timeout=120) for _ in dirs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for model_dir, (outputs, refs) in expected.items():
        sampled: dict[str, list[int]] = {s: [] for s in prompts}
        for step, result in enumerate(got[model_dir]):
            assert result.step_id == step and result.seq_ids == list(prompts)
            for i, (seq_id, token) in enumerate(zip(result.seq_ids, result.token_ids, strict=True)):
                sampled[seq_id].append(token)
                raw = refs[seq_id].logits[step].log_softmax(-1)
                assert result.logprobs[i] == pytest.approx(float(raw[token]), abs=1e-4)
        assert sampled == outputs, model_dir
