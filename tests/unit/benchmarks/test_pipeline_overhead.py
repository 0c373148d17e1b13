from __future__ import annotations

import pytest

from benchmarks.kv_memory import run_engine
from benchmarks.pipeline_overhead import compare, in_process_run, mean_of_runs
from pagedserve.services.cli.loadgen.workload import BenchRequest
from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig


def _run(duration_s: float, num_steps: int, prefix_cache_hit_tokens: int = 0) -> dict:
    return {
        "duration_s": duration_s,
        "num_steps": num_steps,
        "num_output_tokens": 1000,
        "output_throughput": 1000 / duration_s,
        "step_ms": 1000 * duration_s / num_steps,
        "prefix_cache_hit_tokens": prefix_cache_hit_tokens,
    }


def test_in_process_runs_of_the_same_prompts_do_not_hit_the_prefix_cache(tiny_llama_dir) -> None:
    engine = LLMEngine(
        tiny_llama_dir,
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256),
        CacheConfig(block_size=4, num_blocks=128),
        dtype="float32",
    )
    requests = [
        BenchRequest("", [3 + (i * 7 + j) % 50 for j in range(20 + i)], 3) for i in range(4)
    ]
    run_engine(engine, requests, trace=False)  # what the old warm-up did: cache these prompts
    before = in_process_run(engine, requests)
    after = in_process_run(engine, requests)
    assert before["prefix_cache_hit_tokens"] == after["prefix_cache_hit_tokens"] == 0
    assert before["num_steps"] == after["num_steps"]  # the same work, prefills included
    assert before["num_output_tokens"] == after["num_output_tokens"] == 12


def test_two_in_process_runs_average_and_report_their_spread() -> None:
    merged = mean_of_runs(_run(9.0, 100, 4), _run(11.0, 102, 0))
    assert merged["duration_s"] == pytest.approx(10.0)
    assert merged["output_throughput"] == pytest.approx(100.0)
    assert merged["step_ms"] == pytest.approx(1000 * 10.0 / 101)
    assert merged["noise"] == pytest.approx(0.2)
    assert merged["runs_output_throughput"] == pytest.approx([1000 / 9, 1000 / 11])
    assert merged["prefix_cache_hit_tokens"] == 4


def test_overhead_per_step_and_per_token() -> None:
    inproc = _run(10.0, 100)  # 100 ms per step
    pipe = {"output_throughput": 80.0, "step_ms": 125.0, "duration_s": 12.5}
    overhead = compare(inproc, pipe)
    assert overhead["throughput_loss"] == pytest.approx(0.2)
    assert overhead["extra_ms_per_step"] == pytest.approx(25.0)
    assert overhead["extra_ms_per_token"] == pytest.approx(2.5)  # 2.5 s over 1000 tokens
