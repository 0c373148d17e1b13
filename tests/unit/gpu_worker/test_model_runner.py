"""ModelRunner driven by hand-built step plans: deltas, chunking, drops, logprobs, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pagedserve.services.gpu_worker.cpu_cache_sizes import l2_bytes_per_core
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.platforms import resolve_dtype
from pagedserve.services.gpu_worker.platforms.cpu import fused_fp32_step_tokens
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward
from pagedserve.shared.config import CacheConfig
from pagedserve.shared.protocol import CachedSequence, NewSequence, SamplingParams, StepPlan
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf

GREEDY = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
BLOCK_SIZE = 4


def make_runner(model_dir: Path, num_blocks: int = 64) -> ModelRunner:
    return ModelRunner(
        model_dir,
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=num_blocks),
        dtype="float32",
        show_progress=False,
    )


def new_seq(seq_id, tokens, blocks, num_scheduled=None, num_computed=0, sampling=GREEDY):
    return NewSequence(
        seq_id,
        list(tokens),
        len(tokens),
        num_computed,
        len(tokens) - num_computed if num_scheduled is None else num_scheduled,
        list(blocks),
        sampling,
    )


def test_decode_loop_over_deltas_matches_hf(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    prompts = {"a": list(range(3, 20)), "b": [7, 9], "c": list(range(100, 140))}
    blocks = {"a": range(0, 8), "b": range(8, 12), "c": range(12, 30)}
    plan = StepPlan(0, new_seqs=[new_seq(s, p, blocks[s]) for s, p in prompts.items()])
    result = runner.execute(plan)
    assert result.seq_ids == ["a", "b", "c"]
    outputs = {s: [t] for s, t in zip(result.seq_ids, result.token_ids, strict=True)}
    for step in range(1, 10):
        deltas = [
            CachedSequence(s, [outputs[s][-1]], [], len(p) + step - 1, 1)
            for s, p in prompts.items()
        ]
        result = runner.execute(StepPlan(step, cached_seqs=deltas))
        for s, t in zip(result.seq_ids, result.token_ids, strict=True):
            outputs[s].append(t)
    hf = load_hf(tiny_llama_dir)
    for s, p in prompts.items():
        assert_matches_hf(outputs[s], hf_greedy(hf, p, 10), s)


def test_chunked_prompt_samples_only_when_the_last_token_is_reached(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    prompt = list(range(10, 30))
    first = runner.execute(StepPlan(0, new_seqs=[new_seq("a", prompt, range(5), num_scheduled=8)]))
    assert first.seq_ids == [] and first.token_ids == []
    second = runner.execute(StepPlan(1, cached_seqs=[CachedSequence("a", [], [], 8, 12)]))
    assert second.seq_ids == ["a"]
    ref = hf_greedy(load_hf(tiny_llama_dir), prompt, 1)
    assert second.token_ids == ref.token_ids[:1]


def test_result_order_is_new_then_cached_and_drops_apply(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    runner.execute(StepPlan(0, new_seqs=[new_seq("old", [5, 6], [0])]))
    plan = StepPlan(
        1,
        new_seqs=[new_seq("new", [8, 9, 10], [1])],
        cached_seqs=[CachedSequence("old", [11], [], 2, 1)],
    )
    assert runner.execute(plan).seq_ids == ["new", "old"]
    runner.execute(StepPlan(2, finished_seq_ids=["old"], preempted_seq_ids=["new"]))
    assert runner.seqs == {}


def test_logprobs_match_hf_log_softmax(tiny_qwen2_dir):
    runner = make_runner(tiny_qwen2_dir)
    prompt = list(range(40, 75))
    sampling = SamplingParams(temperature=0.0, logprobs=5)
    result = runner.execute(
        StepPlan(0, new_seqs=[new_seq("a", prompt, range(9), sampling=sampling)])
    )
    ref = hf_greedy(load_hf(tiny_qwen2_dir), prompt, 1).logits[0].log_softmax(-1)
    token = result.token_ids[0]
    # fp32 on both sides; the difference is summation order only.
    assert result.logprobs[0] == pytest.approx(float(ref[token]), abs=1e-4)
    top = ref.topk(5)
    assert [t for t, _ in result.top_logprobs[0]] == top.indices.tolist()
    torch.testing.assert_close(
        torch.tensor([v for _, v in result.top_logprobs[0]]), top.values, atol=1e-4, rtol=0
    )


def test_seeded_sampling_is_reproducible_across_batch_composition(tiny_llama_dir):
    sampling = SamplingParams(temperature=1.0, seed=42, max_tokens=8)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]

    def run(extra: list[NewSequence]) -> int:
        runner = make_runner(tiny_llama_dir)
        plan = StepPlan(0, new_seqs=[*extra, new_seq("s", prompt, [10, 11], sampling=sampling)])
        result = runner.execute(plan)
        return result.token_ids[result.seq_ids.index("s")]

    alone = run([])
    crowd = [
        new_seq(f"x{i}", [i + 3] * (i % 4 + 1), [i], sampling=SamplingParams()) for i in range(5)
    ]
    assert run(crowd) == alone
    assert run(crowd[:2]) == alone


def test_unknown_cached_sequence_is_an_error(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    with pytest.raises(ValueError, match="unknown cached sequence ghost"):
        runner.execute(StepPlan(0, cached_seqs=[CachedSequence("ghost", [1], [], 0, 1)]))


def test_too_few_blocks_is_an_error_naming_the_bound(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    with pytest.raises(ValueError, match="9 tokens need 3 blocks, its block table has 2"):
        runner.execute(StepPlan(0, new_seqs=[new_seq("a", list(range(9)), [0, 1])]))


def test_scheduling_past_the_known_tokens_is_an_error(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    with pytest.raises(ValueError, match="within its 3 known tokens"):
        runner.execute(StepPlan(0, new_seqs=[new_seq("a", [1, 2, 3], [0], num_scheduled=5)]))


def test_kv_cache_size_follows_the_memory_budget(tiny_llama_dir):
    # 2 layers * K,V * 4 tokens * 2 kv heads * 16 dims * 4 bytes = 2048 bytes per block.
    runner = ModelRunner(
        tiny_llama_dir,
        CacheConfig(block_size=4, kv_cache_memory=2048 * 10 + 100),
        dtype="float32",
        show_progress=False,
    )
    assert runner.num_blocks == 10
    assert runner.kv_caches[0][0].shape == (10, 4, 2, 16)
    with pytest.raises(ValueError, match="holds no block"):
        ModelRunner(tiny_llama_dir, CacheConfig(kv_cache_memory=100), dtype="float32")


def test_without_a_block_size_the_runner_takes_its_device_default(tiny_llama_dir):
    runner = ModelRunner(
        tiny_llama_dir,
        CacheConfig(num_blocks=4),
        dtype="float32",
        device="cpu",
        show_progress=False,
    )
    assert runner.block_size == 8
    assert runner.kv_caches[0][0].shape == (4, 8, 2, 16)


def test_without_a_token_budget_the_runner_takes_its_device_default(tiny_llama_dir):
    def runner(**kwargs) -> ModelRunner:
        return ModelRunner(tiny_llama_dir, CacheConfig(num_blocks=4), dtype="float32",
                           device="cpu", show_progress=False, **kwargs)  # fmt: skip

    default = runner()
    forward = default.forward_pass  # float32: 768 where the fused pass takes prompt steps
    takes_prompts = isinstance(forward, CpuFusedForward) and forward.takes_prompts()
    fused_budget = fused_fp32_step_tokens(l2_bytes_per_core())  # 512 with a small L2
    assert default.max_num_batched_tokens == (fused_budget if takes_prompts else 512)
    assert runner(max_num_batched_tokens=1024).max_num_batched_tokens == 1024


def test_dtype_names():
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) is torch.float32
    assert resolve_dtype("auto", cpu) in (torch.bfloat16, torch.float32)
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("fp8", cpu)


def test_bfloat16_runner_runs_and_mostly_agrees(tiny_llama_dir):
    runner = ModelRunner(
        tiny_llama_dir,
        CacheConfig(block_size=4, num_blocks=16),
        dtype="bfloat16",
        show_progress=False,
    )
    assert runner.kv_caches[0][0].dtype is torch.bfloat16
    prompt = list(range(50, 70))
    result = runner.execute(StepPlan(0, new_seqs=[new_seq("a", prompt, range(5))]))
    ref = hf_greedy(load_hf(tiny_llama_dir), prompt, 1)
    top5 = ref.logits[0].topk(5).indices.tolist()
    assert result.token_ids[0] in top5  # bf16 rounding may reorder close logits, not far ones


def test_mistral_sliding_window_no_longer_caps_max_model_len(tmp_path):
    from tests.fixtures.tiny_models import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "mistral", "mistral", sliding_window=16)
    runner = ModelRunner(
        model_dir, CacheConfig(block_size=4, num_blocks=32), dtype="float32", show_progress=False
    )
    assert runner.max_model_len == 1024  # the positions; attention slides
    assert [s.sliding_window for s in runner.model.kv_cache_specs()] == [16, 16]
    prompt = list(range(3, 60))  # longer than the window
    result = runner.execute(StepPlan(0, new_seqs=[new_seq("a", prompt, range(15))]))
    assert result.token_ids == hf_greedy(load_hf(model_dir), prompt, 1).token_ids


def kept(seq: NewSequence) -> NewSequence:
    return dataclasses.replace(seq, keep_sample=True)


def test_kept_samples_let_plans_run_on_tokens_still_being_sampled(tiny_llama_dir):
    """Async scheduling: every plan is made before the result of the one before it: it sends
    no token, and schedules the position of the token that step samples. Greedy outputs
    still match HF."""
    runner = make_runner(tiny_llama_dir)
    prompts = {"a": list(range(3, 20)), "b": [7, 9]}
    blocks = {"a": range(0, 8), "b": range(8, 12)}
    plans = [StepPlan(0, new_seqs=[kept(new_seq(s, p, blocks[s])) for s, p in prompts.items()])]
    for step in range(1, 10):
        plans.append(StepPlan(step, cached_seqs=[
            CachedSequence(s, [], [], len(p) + step - 1, 1, keep_sample=True)
            for s, p in prompts.items()
        ]))  # fmt: skip
    outputs: dict[str, list[int]] = {s: [] for s in prompts}
    for plan in plans:
        result = runner.execute(plan)
        for s, t in zip(result.seq_ids, result.token_ids, strict=True):
            outputs[s].append(t)
    hf = load_hf(tiny_llama_dir)
    for s, p in prompts.items():
        assert runner.seqs[s].token_ids == p + outputs[s]
        assert_matches_hf(outputs[s], hf_greedy(hf, p, 10), s)


def test_a_failed_steps_sequences_sit_out_the_plan_made_before_it_was_heard_of(tiny_llama_dir):
    runner = make_runner(tiny_llama_dir)
    runner.execute(StepPlan(0, new_seqs=[kept(new_seq("a", [5, 6], [0])),
                                         kept(new_seq("b", [8, 9], [1]))]))  # fmt: skip
    bad = StepPlan(1, cached_seqs=[
        CachedSequence("a", [], [], 2, 5, keep_sample=True),  # 5 tokens: it holds 3
        CachedSequence("b", [], [], 2, 1, keep_sample=True),
    ])  # fmt: skip
    with pytest.raises(ValueError, match="sequence a: scheduled tokens"):
        runner.execute(bad)
    runner.forget_failed(bad)
    assert "a" not in runner.seqs and "b" not in runner.seqs
    ahead = StepPlan(2, new_seqs=[new_seq("c", [4, 5, 6], [2])],
                     cached_seqs=[CachedSequence("a", [], [], 3, 1, keep_sample=True)])  # fmt: skip
    assert runner.execute(ahead).seq_ids == ["c"]  # "a" sat it out; "c" was not failed for it
    runner.execute(StepPlan(3, finished_seq_ids=["a", "b"]))
    assert runner.failed_seq_ids == set()
    with pytest.raises(ValueError, match="unknown cached sequence a"):
        runner.execute(StepPlan(4, cached_seqs=[CachedSequence("a", [], [], 3, 1)]))
