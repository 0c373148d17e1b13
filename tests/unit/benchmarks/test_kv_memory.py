from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.kv_memory import KVSnapshot, kv_report, run_engine
from pagedserve.services.cli.loadgen.workload import BenchRequest
from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig


def test_report_arithmetic_on_a_hand_made_trace() -> None:
    trace = [
        KVSnapshot(step=1, num_running=2, num_allocated_blocks=4, num_real_tokens=50,
                   num_reserved_slots=120),
        # The peak: 3 requests in 10 blocks of 16 = 160 slots holding 150 real tokens.
        KVSnapshot(step=2, num_running=3, num_allocated_blocks=10, num_real_tokens=150,
                   num_reserved_slots=300),
        KVSnapshot(step=3, num_running=1, num_allocated_blocks=2, num_real_tokens=20,
                   num_reserved_slots=40),
    ]  # fmt: skip
    report = kv_report(trace, block_size=16, num_total_blocks=100, max_model_len=400)
    assert report["peak_step"] == 2 and report["total_slots"] == 1600
    paged = report["paged"]
    assert paged["real_token_fraction"] == pytest.approx(150 / 160)
    assert paged["slots_per_request"] == pytest.approx(160 / 3)
    assert paged["requests_that_fit"] == 30  # 1600 // 53.3
    reserve = report["reserve_max_tokens"]
    assert reserve["real_token_fraction"] == pytest.approx(0.5)
    assert reserve["requests_that_fit"] == 16  # 1600 // 100
    worst = report["reserve_max_model_len"]
    assert worst["real_token_fraction"] == pytest.approx(150 / 1200)
    assert worst["requests_that_fit"] == 4


def test_report_refuses_an_empty_trace() -> None:
    with pytest.raises(ValueError, match="empty"):
        kv_report([], 16, 10, 100)
    with pytest.raises(ValueError, match="no request was running"):
        kv_report([KVSnapshot(1, 0, 0, 0, 0)], 16, 10, 100)


def test_engine_run_traces_real_tokens(tiny_llama_dir: Path) -> None:
    engine = LLMEngine(
        tiny_llama_dir,
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256),
        CacheConfig(block_size=8, num_blocks=64),
        dtype="float32",
    )
    requests = [
        BenchRequest("", list(range(3, 3 + n)), out) for n, out in [(5, 7), (20, 3), (9, 12)]
    ]
    run = run_engine(engine, requests)
    assert run.num_failed == 0
    assert run.num_output_tokens == 7 + 3 + 12
    assert run.num_steps == len(run.trace) == len(run.step_times_s)
    first = run.trace[0]  # every prompt prefilled in step 1, one sample each
    assert first.num_running == 3
    assert first.num_real_tokens == 5 + 20 + 9
    assert first.num_allocated_blocks == 1 + 3 + 2  # ceil(n / 8)
    assert first.num_reserved_slots == (5 + 7) + (20 + 3) + (9 + 12)
    assert run.trace[-1].num_running == 0
    assert max(run.batch_sizes) == 3
    report = kv_report(run.trace, 8, 64, 256)
    assert 0 < report["paged"]["real_token_fraction"] <= 1
    assert (
        report["paged"]["real_token_fraction"] > report["reserve_max_tokens"]["real_token_fraction"]
    )


def test_other_block_sizes_from_the_peak_token_counts() -> None:
    # 50, 60 and 40 tokens: 4 + 4 + 3 blocks of 16 (176 slots), 7 + 8 + 5 blocks of 8 (160).
    peak = KVSnapshot(step=1, num_running=3, num_allocated_blocks=11, num_real_tokens=150,
                      num_reserved_slots=300, token_counts=(50, 60, 40))  # fmt: skip
    report = kv_report([peak], block_size=16, num_total_blocks=100, max_model_len=400)
    by_size = report["paged_real_token_fraction_by_block_size"]
    assert by_size["1"] == pytest.approx(1.0)
    assert by_size["8"] == pytest.approx(150 / 160)
    assert by_size["16"] == pytest.approx(150 / 176)
    assert by_size["16"] == pytest.approx(report["paged"]["real_token_fraction"])
    assert by_size["32"] == pytest.approx(150 / 192)
