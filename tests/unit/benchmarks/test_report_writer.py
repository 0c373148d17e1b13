from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report_writer import build_report

DIST = {"mean": 10.0, "p50": 9.0, "p90": 12.0, "p99": 15.0}


def test_report_from_result_files(tmp_path: Path) -> None:
    run = {
        "max_concurrency": 8,
        "request_throughput": 1.5,
        "output_throughput": 120.0,
        "ttft_ms": DIST,
        "tpot_ms": DIST,
        "itl_ms": DIST,
        "e2e_ms": DIST,
        "num_failed": 0,
        "fresh_prompts": True,
    }
    hf = {
        "batch_size": 32,
        "request_throughput": 0.5,
        "output_throughput": 30.0,
        "e2e_ms": DIST,
        "num_generated_tokens": 900,
        "total_output_tokens": 300,
        "num_threads": 1,
        "dtype": "bfloat16",
        "probes": [{"batch_size": 32, "output_throughput": 30.0, "num_requests": 16}],
    }
    workload = {
        "num_requests": 16,
        "total_output_tokens": 300,
        "prompt_len": {"min": 8, "mean": 40.0, "max": 90},
        "output_len": {"min": 4, "mean": 18.75, "max": 60},
    }
    serve = {
        "workload": workload,
        "warmup": {"num_requests": 8, "num_failed": 0},
        "runs": [run, {**run, "max_concurrency": 16}],
        "hf_baseline": hf,
        "speedup_vs_hf": 4.0,
    }
    roofline = {
        "matmul_flops_per_s": {"bfloat16": 2e11},
        "num_threads": 1,
        "num_params": 1.35e8,
        "flops_per_token": 2.7e8,
        "context_len": 40,
        "flop_limit_tokens_per_s": 740.0,
        "dtype": "bfloat16",
        "best_decode_tokens_per_s": 370.0,
        "best_batch_size": 64,
        "fraction_of_flop_limit": 0.5,
        "decode_levels": [{"batch_size": 64, "tokens_per_s": 370.0, "step_ms": 173.0}],
    }
    (tmp_path / "serve.json").write_text(json.dumps(serve))
    (tmp_path / "roofline.json").write_text(json.dumps(roofline))
    report = build_report(tmp_path)
    assert "| pagedserve, concurrency 8 | 1.50 | 120.0 | 9 / 15 |" in report
    assert "| HF generate, static batches of 32 | 0.50 | 30.0 |" in report
    assert "4.00x output tokens/s" in report
    assert "HF generated 900 tokens to deliver 300" in report
    assert "370 tokens/s at batch 64 = 50% of the FLOP limit" in report
    assert "8 unmeasured warm-up requests first. Each level sends the same lengths with fresh" in (
        report
    )
    assert "Pipeline hops" not in report  # no pipeline_overhead.json: section skipped


def test_report_says_when_levels_repeat_prompts(tmp_path: Path) -> None:
    latencies = {"ttft_ms": DIST, "tpot_ms": DIST, "itl_ms": DIST, "e2e_ms": DIST}
    run = {"max_concurrency": 4, "request_throughput": 1.0, "output_throughput": 10.0,
           "num_failed": 0, **latencies}  # fmt: skip
    workload = {
        "num_requests": 2,
        "total_output_tokens": 20,
        "prompt_len": {"min": 8, "mean": 9.0, "max": 10},
        "output_len": {"min": 10, "mean": 10.0, "max": 10},
    }
    runs = [{**run, "fresh_prompts": True}, {**run, "fresh_prompts": False}]
    (tmp_path / "serve.json").write_text(json.dumps({"workload": workload, "runs": runs}))
    assert "Levels repeat the prompts: later ones may hit the prefix cache." in build_report(
        tmp_path
    )
