"""`python -m benchmarks.vs_vllm` end to end against a real started pipeline (Redis,
scheduler, worker, gateway as processes) on a tiny random model, without the vLLM peer: one
concurrency level and two Poisson rates, one round; the JSON, the report and the rate plot
are written beside each other and every request came back whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.vs_vllm import main
from tests.integration.pipeline.served_model import build_served_model

pytestmark = pytest.mark.integration


def test_the_sweep_runs_against_pagedserve_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    model_dir = build_served_model(tmp_path / "served")
    out = tmp_path / "results" / "vs_vllm"
    code = main([
        "--model", str(model_dir), "--dtype", "float32", "--threads", "1", "--max-num-seqs", "8",
        "--num-prompts", "4", "--prompt-len", "12", "--prompt-len-range", "4,40",
        "--output-len", "4", "--output-len-range", "2,8", "--seed", "5",
        "--concurrency", "2", "--rates", "4,8", "--rounds", "1", "--num-warmups", "1",
        "--max-steal", "1.0", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert "peer" not in result and list(result["rounds"]) == ["pagedserve"]
    [round_] = result["rounds"]["pagedserve"]
    assert [(p["max_concurrency"], p["request_rate"]) for p in round_["points"]] == [
        (2, None),
        (None, 4.0),
        (None, 8.0),
    ]
    for p in round_["points"]:
        assert p["num_completed"] == 4 and p["num_failed"] == 0
        assert p["output_tok_s"] > 0 and 0 < p["ttft_p50_ms"] <= p["ttft_p99_ms"]
        clock = p["step_clock"]  # the engine's counters moved with the level
        assert clock["steps"] >= 1 and clock["execute_ms_per_step"] > 0
        assert clock["outside_execute_ms_per_step"] > 0 and 0 < clock["execute_share"] < 1
    medians = result["medians"]["pagedserve"]
    assert [m["rounds_kept"] for m in medians] == [[1], [1], [1]]
    assert medians[1]["output_tok_s"] == round_["points"][1]["output_tok_s"]
    assert result["machine"]["torch_cpu_capability"] and result["dtype"] == "float32"
    text = out.with_suffix(".md").read_text()
    assert "| 4 req/s |" in text and "No peer" in text
    assert "| 2 in flight | " in text.split("pagedserve's steps")[1]
    assert result["command"].startswith("python -m benchmarks.vs_vllm --model ")
    assert out.with_name("vs_vllm_rates.png").read_bytes()[:4] == b"\x89PNG"
