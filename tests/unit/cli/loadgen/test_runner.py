"""`pagedserve bench` levels and warm-up against a fake server on loopback: a synthetic sweep
sends each level fresh prompts of the same lengths, so that no level finds another's (or the
warm-up's) prompts in the server's prefix cache."""

from __future__ import annotations

import argparse

import pytest

from pagedserve.services.cli import bench
from pagedserve.services.cli.loadgen.runner import (
    LoadConfig,
    bench_server,
    plan_levels,
    run_levels,
    warmup_requests,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig
from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload
from tests.unit.benchmarks.fake_openai_server import fake_openai_server
from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer

NUM_REQUESTS = 6
NUM_WARMUPS = 8
PROMPTS = LengthDistribution(median=12, sigma=0.5, min_len=6, max_len=30)
OUTPUTS = LengthDistribution(median=3, sigma=0.5, min_len=2, max_len=6)
LOADS = [LoadConfig(max_concurrency=c) for c in (1, 4, 2)]


def bench_args(base_url: str) -> argparse.Namespace:
    return argparse.Namespace(
        base_url=base_url, model="m", endpoint="completions", api_key=None, no_ignore_eos=False,
        ready_timeout=10.0, redis_url=None, metrics_url=None, label="test", seed=3,
    )  # fmt: skip


def word_counts(prompts: list[str]) -> list[int]:
    return sorted(len(p.split()) for p in prompts)


def test_a_synthetic_sweep_sends_fresh_prompts_per_level_after_a_warmup() -> None:
    tokenizer = FakeTokenizer()
    requests = synthetic_workload(tokenizer, NUM_REQUESTS, PROMPTS, OUTPUTS, seed=3)
    levels = plan_levels(requests, tokenizer, LOADS, seed=3, synthetic=True)
    warmup = warmup_requests(requests, tokenizer, NUM_WARMUPS, seed=3 + len(LOADS))
    with fake_openai_server() as server:
        result = bench_server(bench_args(server.base_url), levels, warmup)
    sent = server.prompts
    assert len(sent) == NUM_WARMUPS + len(LOADS) * NUM_REQUESTS
    warm = sent[:NUM_WARMUPS]  # each run ends before the next starts
    per_level = [
        sent[NUM_WARMUPS + i * NUM_REQUESTS : NUM_WARMUPS + (i + 1) * NUM_REQUESTS]
        for i in range(len(LOADS))
    ]
    assert sorted(per_level[0]) == sorted(r.prompt for r in requests)
    batches = [set(warm), *(set(level) for level in per_level)]
    assert sum(len(b) for b in batches) == len(set().union(*batches)), "a prompt was repeated"
    assert all(word_counts(level) == word_counts(per_level[0]) for level in per_level)
    assert result["warmup"] == {"num_requests": NUM_WARMUPS, "num_failed": 0}
    assert [run["fresh_prompts"] for run in result["runs"]] == [True, True, True]
    for run in result["runs"]:
        assert run["num_completed"] == NUM_REQUESTS and run["num_failed"] == 0
        assert run["total_output_tokens"] == result["workload"]["total_output_tokens"]


def test_dataset_levels_repeat_the_prompts_and_say_so() -> None:
    requests = synthetic_workload(FakeTokenizer(), NUM_REQUESTS, PROMPTS, OUTPUTS, seed=3)
    levels = plan_levels(requests, FakeTokenizer(), LOADS[:2], seed=3, synthetic=False)
    with fake_openai_server() as server:
        runs = run_levels(EndpointConfig(server.base_url, "m"), levels)
    first, second = server.prompts[:NUM_REQUESTS], server.prompts[NUM_REQUESTS:]
    assert sorted(first) == sorted(second) == sorted(r.prompt for r in requests)
    assert [run["fresh_prompts"] for run in runs] == [True, False]
    assert "prefix_cache_note" not in runs[0]
    assert "prefix cache" in runs[1]["prefix_cache_note"]


def test_warmup_cycles_through_the_workload_shapes_with_its_own_words() -> None:
    requests = synthetic_workload(FakeTokenizer(), 3, PROMPTS, OUTPUTS, seed=3)
    warmup = warmup_requests(requests, FakeTokenizer(), 7, seed=9)
    shapes = [(r.prompt_len, r.output_len) for r in requests]
    assert [(r.prompt_len, r.output_len) for r in warmup] == (shapes * 3)[:7]
    assert not {r.prompt for r in warmup} & {r.prompt for r in requests}
    assert warmup_requests(requests, FakeTokenizer(), 0, seed=9) == []
    with pytest.raises(ValueError, match="num_warmups must be >= 0, got -1"):
        warmup_requests(requests, FakeTokenizer(), -1, seed=9)


def test_num_warmups_defaults_to_8_and_refuses_negatives(capsys) -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    assert parser.parse_args(["bench"]).num_warmups == 8
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--num-warmups", "-1"])
    assert "--num-warmups: must be >= 0, got -1" in capsys.readouterr().err


def test_a_server_without_step_counters_reports_no_engine_time() -> None:
    requests = synthetic_workload(FakeTokenizer(), NUM_REQUESTS, PROMPTS, OUTPUTS, seed=3)
    levels = plan_levels(requests, FakeTokenizer(), LOADS[:1], seed=3, synthetic=True)
    with fake_openai_server() as server:
        runs = run_levels(EndpointConfig(server.base_url, "m"), levels)
    assert runs[0]["engine_time"] is None
