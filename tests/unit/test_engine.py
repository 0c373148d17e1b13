"""LLMEngine against transformers: greedy outputs token-identical for continuous batches,
prefix-cache hits, preemption and chunked prefill."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest
import torch

from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker import cpu_threads
from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, StepPlan
from tests.fixtures.hf_reference import assert_matches_hf, hf_greedy, load_hf
from tests.fixtures.tiny_models import TINY_VOCAB_SIZE

PROMPT_LENGTHS = (1, 3, 9, 16, 31, 64, 150, 320)
MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def make_engine(
    model_dir: Path,
    num_blocks: int = 256,
    block_size: int = 8,
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 16,
) -> LLMEngine:
    return LLMEngine(
        model_dir,
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=1024,
        ),
        CacheConfig(block_size=block_size, num_blocks=num_blocks),
        dtype="float32",
    )


def random_prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB_SIZE) for _ in range(n)] for n in lengths]


def check_against_hf(model_dir: Path, engine: LLMEngine, prompts: list[list[int]]) -> None:
    results = engine.generate(prompts, GREEDY)
    hf = load_hf(model_dir)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.finish_reason == "length"
        ref = hf_greedy(hf, prompt, MAX_TOKENS)
        assert_matches_hf(result.token_ids, ref, f"prompt of {len(prompt)} tokens")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_matches_hf_in_one_continuous_batch(arch, tiny_llama_dir, tiny_qwen2_dir):
    model_dir = tiny_llama_dir if arch == "llama" else tiny_qwen2_dir
    engine = make_engine(model_dir)
    check_against_hf(model_dir, engine, random_prompts(PROMPT_LENGTHS))
    assert engine.scheduler.stats().num_finished == len(PROMPT_LENGTHS)


def test_shared_prefix_hits_the_prefix_cache_and_still_matches(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, block_size=4)
    prefix = random_prompts((40,), seed=1)[0]
    first = engine.generate([[*prefix, 5, 6, 7]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    prompts = [prefix + tail for tail in random_prompts((1, 5, 12, 30), seed=2)]
    results = engine.generate(prompts, GREEDY)
    assert all(r.num_cached_tokens >= 40 for r in results), [r.num_cached_tokens for r in results]
    hf = load_hf(tiny_llama_dir)
    for prompt, result in zip(prompts, results, strict=True):
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, MAX_TOKENS))


def test_reset_prefix_cache_makes_a_rerun_compute_its_prompt_again(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, block_size=4)
    prompt = random_prompts((41,), seed=5)[0]
    first = engine.generate([prompt], GREEDY)[0]
    assert engine.generate([prompt], GREEDY)[0].num_cached_tokens == 40  # without a reset
    engine.reset_prefix_cache()
    hits_before = engine.scheduler.stats().prefix_cache_hits
    rerun = engine.generate([prompt], GREEDY)[0]
    assert rerun.num_cached_tokens == 0
    assert engine.scheduler.stats().prefix_cache_hits == hits_before
    assert rerun.token_ids == first.token_ids


def test_reset_prefix_cache_is_refused_while_a_request_runs(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, block_size=4)
    engine.add_request(GenerateRequest("r", random_prompts((9,))[0], GREEDY))
    engine.step()
    with pytest.raises(ValueError, match=r"unfinished \(1 running, 0 waiting\): finish or abort"):
        engine.reset_prefix_cache()
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_prefix_cache()
    assert engine.scheduler.kv.pool.cached_blocks == {}


def test_preemption_under_a_small_cache_still_matches(tiny_llama_dir):
    # 8 sequences of ~60-90 tokens need ~24 blocks each at once; 40 blocks force preemption.
    engine = make_engine(tiny_llama_dir, num_blocks=40, block_size=4)
    prompts = random_prompts((50, 60, 70, 55, 65, 75, 58, 62), seed=3)
    check_against_hf(tiny_llama_dir, engine, prompts)
    assert engine.scheduler.stats().num_preemptions > 0


def test_chunked_prefill_matches(tiny_qwen2_dir):
    engine = make_engine(tiny_qwen2_dir, max_num_batched_tokens=24)
    check_against_hf(tiny_qwen2_dir, engine, random_prompts((100, 7, 45, 1, 24, 25, 60, 3)))


def test_step_streams_deltas_and_finishes_with_length(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request(
        GenerateRequest("r1", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    )
    deltas = []
    while engine.has_unfinished_requests():
        deltas.extend(engine.step())
    assert [len(d.token_ids) for d in deltas] == [1, 1, 1]
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 3
    assert "r1" in engine.runner.seqs  # the drop travels with the next plan
    assert engine.step() == []
    assert "r1" not in engine.runner.seqs


def test_eos_stops_generation_with_the_models_eos(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    assert engine.eos_token_ids == (2,)
    # The tiny model's EOS is token 2: stopping on whatever greedy picks first proves the path.
    first = engine.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=1))[0]
    sp = SamplingParams(temperature=0, max_tokens=5, stop_token_ids=(first.token_ids[0],))
    stopped = engine.generate([[9, 8, 7]], sp)[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == []


def test_string_prompts_need_a_tokenizer(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(ValueError, match="has no tokenizer"):
        engine.generate(["hello"], GREEDY)


def test_mismatched_sampling_list_is_rejected(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(ValueError, match="2 prompts but 1 sampling"):
        engine.generate([[1], [2]], [GREEDY])


def test_cli_generate_writes_jsonl(tiny_llama_dir, tmp_path):
    from pagedserve.services.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt_token_ids": [5, 6, 7]}\n\n{"prompt_token_ids": [9], "max_tokens": 2}\n'
    )
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--model", str(tiny_llama_dir), "--prompts", str(prompts)]
    argv += ["--output", str(out), "--max-tokens", "4", "--dtype", "float32", "--ignore-eos"]
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["token_ids"]) for r in records] == [4, 2]
    assert [r["finish_reason"] for r in records] == ["length", "length"]
    engine = make_engine(tiny_llama_dir)
    assert records[0]["token_ids"] == engine.generate([[5, 6, 7]], GREEDY)[0].token_ids[:4]


def test_cli_generate_reports_bad_input(tiny_llama_dir, tmp_path, capsys):
    from pagedserve.services.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_token_ids": [5], "temperature": -1}\n')
    argv = ["generate", "--model", str(tiny_llama_dir), "--prompts", str(prompts)]
    assert main([*argv, "--output", str(tmp_path / "o.jsonl")]) == 1
    assert "temperature must be >= 0, got -1" in capsys.readouterr().err


@pytest.mark.slow
def test_default_model_greedy_matches_hf():
    from pagedserve.services.gpu_worker.default_model import ensure_default_model

    model_dir = ensure_default_model()
    engine = LLMEngine(
        "smollm2",
        SchedulerConfig(max_num_batched_tokens=256, max_model_len=1024),
        CacheConfig(block_size=16, num_blocks=128),
        dtype="float32",
    )
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * 6]
    results = engine.generate(texts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    hf = load_hf(model_dir)
    for result in results:
        ref = hf_greedy(hf, result.prompt_token_ids, 8)
        assert_matches_hf(result.token_ids, ref, result.text or "")
    assert "Paris" in results[0].text


def test_seeded_sampling_survives_preemption_and_batch_changes(tiny_llama_dir):
    prompts = random_prompts((50, 60, 70, 55, 65, 75, 58, 62), seed=4)
    seeded = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=12, ignore_eos=True)
        for i in range(len(prompts))
    ]
    roomy = make_engine(tiny_llama_dir, num_blocks=400, block_size=4).generate(prompts, seeded)
    tight_engine = make_engine(tiny_llama_dir, num_blocks=40, block_size=4)
    tight = tight_engine.generate(prompts, seeded)
    assert tight_engine.scheduler.stats().num_preemptions > 0
    assert [r.token_ids for r in tight] == [r.token_ids for r in roomy]
    alone = make_engine(tiny_llama_dir).generate([prompts[3]], [seeded[3]])[0]
    assert alone.token_ids == roomy[3].token_ids
    unseeded = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)] * 2
    a, b = make_engine(tiny_llama_dir).generate([prompts[0]] * 2, unseeded)
    assert a.token_ids != b.token_ids  # no accidental fixed seed


def test_generate_fails_loudly_when_the_scheduler_is_stuck(tiny_llama_dir, monkeypatch):
    engine = make_engine(tiny_llama_dir)
    engine.add_request(GenerateRequest("r", [1, 2], GREEDY))
    monkeypatch.setattr(engine.scheduler, "schedule", lambda: StepPlan(0))
    with pytest.raises(RuntimeError, match="cannot make progress"):
        engine.generate([[3, 4]], GREEDY)


def test_a_rejected_prompt_aborts_the_ones_already_queued_in_that_call(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    good = random_prompts((5, 7), seed=3)
    with pytest.raises(RequestRejectedError, match="outside the vocabulary"):
        engine.generate([*good, [TINY_VOCAB_SIZE + 1]], GREEDY)
    assert not engine.has_unfinished_requests()  # nothing left to run in the next call
    assert engine.scheduler.stats().num_aborted == 2
    [result] = engine.generate([good[0]], GREEDY)  # and the engine serves on
    assert result.finish_reason == "length" and len(result.token_ids) == MAX_TOKENS


def test_the_engine_knows_its_vocabulary(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    assert engine.shape.vocab_size == TINY_VOCAB_SIZE == engine.scheduler.vocab_size


def test_speculative_decoding_keeps_greedy_outputs_those_of_hf(tiny_llama_dir):
    """n-gram drafts checked by a model that rarely repeats itself (most are rejected): the
    same tokens as HF."""
    engine = LLMEngine(
        tiny_llama_dir,
        SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=512,
            max_model_len=1024,
            num_speculative_tokens=3,
            speculative_max_num_seqs=16,
        ),
        CacheConfig(block_size=8, num_blocks=256),
        dtype="float32",
    )
    rng = random.Random(5)
    motif = [rng.randrange(3, TINY_VOCAB_SIZE) for _ in range(6)]
    prompts = [motif * 6, motif * 3 + random_prompts((9,))[0], *random_prompts((1, 31), seed=2)]
    steps: list[StepPlan] = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: steps.append(schedule()) or steps[-1]
    sampling = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    results = engine.generate(prompts, sampling)
    hf = load_hf(tiny_llama_dir)
    for prompt, result in zip(prompts, results, strict=True):
        assert_matches_hf(result.token_ids, hf_greedy(hf, prompt, 40), f"{len(prompt)} tokens")
    assert [c for p in steps for c in p.cached_seqs if c.draft_token_ids]


@pytest.mark.parametrize("min_tokens", [0, 32], ids=["plain", "min-tokens-as-bench-clients"])
def test_speculative_decoding_saves_steps_where_text_repeats(min_tokens):
    """The default model continues a repeated motif, so drafts are right: the same tokens as
    without drafts, in fewer steps; also while short of min_tokens (benchmark clients send
    min_tokens = max_tokens beside ignore_eos)."""
    config = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024, num_speculative_tokens=0
    )
    engine = LLMEngine("smollm2", config, CacheConfig(), dtype="float32")
    prompts = [[504, 1552, 28, 2018, 30] * 8, [1024, 33, 11208, 30] * 6]
    sampling = SamplingParams(
        temperature=0.0, max_tokens=32, ignore_eos=True, min_tokens=min_tokens
    )
    plain = engine.generate(prompts, sampling)
    plain_steps = engine.scheduler.stats().num_steps
    engine.scheduler.config = dataclasses.replace(config, num_speculative_tokens=3)
    drafted = engine.generate(prompts, sampling)
    drafted_steps = engine.scheduler.stats().num_steps - plain_steps
    assert [r.token_ids for r in drafted] == [r.token_ids for r in plain]
    assert drafted_steps < plain_steps * 0.7, (drafted_steps, plain_steps)


def test_an_engine_on_the_cpu_drafts_by_default():
    """Given no draft count, the engine adopts its CPU worker's default (3)."""
    engine = LLMEngine("smollm2", SchedulerConfig(max_model_len=256), CacheConfig())
    assert engine.scheduler.config.num_speculative_tokens == 3
    prompt = [504, 1552, 28, 2018, 30] * 8
    engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert engine.scheduler.stats().spec_num_drafts > 0


def test_the_thread_count_chosen_at_start_is_chosen_again_while_it_steps(
    tiny_llama_dir, monkeypatch
):
    """Started where the load average said every core was busy (one thread), the engine takes
    the cores back once its governor sees them idle, as the worker does; a fixed count
    (PAGEDSERVE_NUM_THREADS) is left alone."""
    cores = cpu_threads.usable_cores()
    if cores < 2:
        pytest.skip("one usable core: there is no count to raise")
    before = torch.get_num_threads()
    monkeypatch.delenv("PAGEDSERVE_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cores), 0.0, 0.0))
    try:
        engine = make_engine(tiny_llama_dir)
        assert torch.get_num_threads() == 1 and engine.thread_governor is not None
        monkeypatch.setattr(cpu_threads, "other_cores_used", lambda before, after: 0.0)
        engine.thread_governor.interval_s = 0.0  # decide at the next step
        engine.generate(random_prompts((9,)), GREEDY)
        assert torch.get_num_threads() == cores

        monkeypatch.setenv("PAGEDSERVE_NUM_THREADS", "1")
        assert make_engine(tiny_llama_dir).thread_governor is None
    finally:
        torch.set_num_threads(before)
