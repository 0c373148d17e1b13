"""benchmarks/moe_kernel.py: --smoke runs the kernel and the torch grouping under the
interpreter, checks they agree and writes its table; without CUDA the real run refuses."""

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
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.moe_kernel", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_smoke_run_writes_a_table_of_agreeing_results(tmp_path: Path) -> None:
    result = run_benchmark("--smoke", "--sweep", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "moe_kernel_cpu_interpreter.md").read_text()
    assert "NOT GPU numbers" in table
    rows = json.loads((tmp_path / "moe_kernel_cpu_interpreter.json").read_text())["rows"]
    assert [row["tokens"] for row in rows] == [1, 19]
    assert all(row["ok"] and row["kernel_ms"] > 0 for row in rows)
    assert all(len(row["swept"]) == 2 and row["best_ms"] > 0 for row in rows)  # --sweep


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_real_run_without_cuda_exits_non_zero(tmp_path: Path) -> None:
    result = run_benchmark("--out-dir", str(tmp_path))
    assert result.returncode == 2
    assert "needs a CUDA device" in result.stdout
