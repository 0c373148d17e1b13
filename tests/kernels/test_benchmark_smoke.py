"""benchmarks/kernels.py: the --smoke path runs every op under the interpreter and writes
its table; without CUDA the real run refuses with a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_smoke_run_writes_a_table_of_correct_results(tmp_path: Path) -> None:
    result = run_benchmark("--smoke", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "kernels_cpu_interpreter.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 5  # header + one row per smoke case
    for op in ("decode", "prefill", "kv_write"):
        assert any(f"| {op} |" in row for row in rows), op
    assert all(row.endswith("| ok |") for row in rows[1:]), table
    assert "NOT GPU numbers" in table
    data = json.loads((tmp_path / "kernels_cpu_interpreter.json").read_text())
    assert [c["prefill_grid"] for c in data["cases"] if c["name"].startswith("mixed")] == [
        "flat",
        "padded",
    ]
    assert all(c["ok"] for c in data["cases"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_real_run_without_cuda_exits_non_zero(tmp_path: Path) -> None:
    result = run_benchmark("--out-dir", str(tmp_path))
    assert result.returncode == 2
    assert "needs a CUDA device" in result.stdout
    assert not list(tmp_path.iterdir())


def test_flop_and_byte_counts() -> None:
    from benchmarks.kernels import BenchCase, attention_flops, bytes_moved, make_inputs

    case = BenchCase("x", "prefill", (10, 3), (4, 1), 2, 1, 8, 16, "fp16")
    # Seq 0: 4 new tokens after a 6-token prefix attend 7..10 keys; seq 1 attends 3.
    assert attention_flops(case) == 4 * (7 + 8 + 9 + 10 + 3) * 2 * 8
    inputs = make_inputs(case, torch.device("cpu"))
    kv = 2 * (10 + 3) * 1 * 8 * 2  # K and V rows of every context token, fp16
    q_and_out = 2 * 5 * 2 * 8 * 2
    assert bytes_moved(case, inputs) == kv + q_and_out
    assert sorted(inputs["block_tables"].flatten().tolist()) == [0, 1]  # a permutation
