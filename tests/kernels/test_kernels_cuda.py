"""On a CUDA machine: the compiled kernels (not the interpreter, which conftest turns on for
this process) at serving shapes, checked against the reference on the device by the
benchmark script's correctness pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_kernels_match_the_reference_on_cuda(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels", "--iters", "5", "--out-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    table = next(tmp_path.glob("kernels_*.md")).read_text()
    assert "FAIL" not in table, table
