"""benchmarks/engine_parity.py's comparison of a CUDA run against the CPU fp32 reference:
first divergence, top-k containment there, logprob gaps on the agreeing prefix, verdicts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.engine_parity import BF16_LOGPROB_ATOL, Completion, compare, verdicts

REPO_ROOT = Path(__file__).resolve().parents[3]
REFERENCE = Completion([5, 6, 7, 8], [-0.1, -0.5, -1.0, -0.2], [[5, 9], [6, 1], [7, 3], [8, 2]])


def test_identical_runs_agree_everywhere() -> None:
    result = compare(REFERENCE, REFERENCE)
    assert (result.first_divergence, result.divergence_in_top_k) == (None, True)
    assert result.max_logprob_diff == 0.0


def test_divergence_inside_each_others_top_k_is_a_near_tie() -> None:
    near_tie = Completion([5, 6, 3, 4], [-0.12, -0.45, -1.1, -0.3], [[5], [6], [3, 7], [4]])
    result = compare(REFERENCE, near_tie)
    assert result.first_divergence == 2
    assert result.divergence_in_top_k
    assert result.max_logprob_diff == pytest.approx(0.05)  # positions 0 and 1 only


def test_divergence_outside_the_top_k_is_a_bug() -> None:
    wrong = Completion([5, 4, 7, 8], [-0.1, -3.0, -1.0, -0.2], [[5], [4, 0], [7], [8]])
    assert not compare(REFERENCE, wrong).divergence_in_top_k


def test_verdicts_need_exact_fp32_and_bounded_bf16() -> None:
    exact = compare(REFERENCE, REFERENCE)
    drift = Completion(REFERENCE.token_ids, [-0.1, -0.5, -1.0 - 2 * BF16_LOGPROB_ATOL, -0.2],
                       REFERENCE.top_ids)  # fmt: skip
    result = verdicts([exact, exact], [exact, compare(REFERENCE, drift)])
    assert result["fp32_ok"] and result["fp32_prompts_agreeing"] == 2
    assert not result["bf16_ok"]
    assert result["bf16_max_logprob_diff"] == pytest.approx(2 * BF16_LOGPROB_ATOL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_without_cuda_it_refuses(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_parity", "--out", str(tmp_path / "x.json")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "needs a CUDA device" in result.stderr
    assert not (tmp_path / "x.json").exists()
