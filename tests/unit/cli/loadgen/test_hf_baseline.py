from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.services.cli.loadgen.hf_baseline import (
    load_hf_model,
    run_hf_baseline,
    run_static_batches,
)
from pagedserve.services.cli.loadgen.workload import BenchRequest

REQUESTS = [BenchRequest("", list(range(3, 3 + n)), out) for n, out in [(4, 3), (9, 6), (2, 2)]]


def test_static_batches_count_useful_tokens_and_padding_waste(tiny_llama_dir: Path) -> None:
    model, _ = load_hf_model(tiny_llama_dir, torch.float32)
    result = run_static_batches(model, 0, REQUESTS, batch_size=2)
    assert result["total_output_tokens"] == 3 + 6 + 2
    # Batch 1 generates max(3, 6) = 6 tokens for both rows, batch 2 its own 2.
    assert result["num_generated_tokens"] == 2 * 6 + 2
    assert result["output_throughput"] == pytest.approx(11 / result["duration_s"])
    assert result["e2e_ms"]["p50"] <= result["e2e_ms"]["p99"]
    with pytest.raises(ValueError, match="batch_size"):
        run_static_batches(model, 0, REQUESTS, batch_size=0)


def test_baseline_picks_the_fastest_probe(tiny_llama_dir: Path) -> None:
    result = run_hf_baseline(tiny_llama_dir, REQUESTS, torch.float32, batch_sizes=(1, 3))
    assert [p["batch_size"] for p in result["probes"]] == [1, 3]
    best = max(result["probes"], key=lambda p: p["output_throughput"])
    assert result["batch_size"] == best["batch_size"]
    assert result["num_requests"] == 3 and result["dtype"] == "float32"


def test_probe_batches_are_reused_for_the_rest(tiny_llama_dir: Path) -> None:
    requests = REQUESTS * 2  # 6 requests; probing the first 3 with batch size 3
    result = run_hf_baseline(tiny_llama_dir, requests, torch.float32, batch_sizes=(3,))
    assert result["num_requests"] == 6 and result["batch_size"] == 3
    assert result["total_output_tokens"] == 2 * (3 + 6 + 2)
    assert result["num_generated_tokens"] == 2 * 3 * 6  # two batches of 3 rows x 6 tokens
    assert result["duration_s"] > result["probes"][0]["duration_s"]
