"""The CPU attention A/B tool: another revision's kernel built and timed beside this tree's,
their outputs compared bit for bit."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from benchmarks import cpu_attention_ab
from pagedserve.kernels import cpu_paged_attention

needs_git_and_kernel = pytest.mark.skipif(
    shutil.which("git") is None
    or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True).returncode != 0
    or cpu_paged_attention.load() is None,
    reason="needs a git checkout and the C kernel",
)


@needs_git_and_kernel
def test_committed_kernel_against_itself_is_bit_identical(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cpu_attention_ab, "CASES", [(3, 40, 2)])
    monkeypatch.setattr(cpu_attention_ab, "PROMPT_CASES", [("2 + a prompt", [9, 30], [1, 30])])
    assert (
        cpu_attention_ab.main(
            ["--base", "HEAD", "--repeats", "2", "--threads", "1", "--layers", "2"]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    rows = [line for line in printed if line.startswith("| 3 ")]
    assert len(rows) == 2  # fp32 and bf16
    prompt_rows = [line for line in printed if line.startswith("| 2 + a prompt ")]
    assert len(prompt_rows) == 1
    committed = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", "kernels/"], capture_output=True
    ).returncode == 0  # fmt: skip
    if committed:  # the same source: the same bits
        assert all(row.rstrip().endswith("| True |") for row in rows + prompt_rows)


@needs_git_and_kernel
def test_a_revision_without_the_kernel_is_refused(capsys) -> None:
    assert cpu_attention_ab.main(["--base", "no-such-revision", "--repeats", "1"]) == 2
    assert "no kernels/cpu_paged_attention.c at 'no-such-revision'" in capsys.readouterr().err


def test_cases_read_inside_their_blocks() -> None:
    step, query, k_caches, _ = cpu_attention_ab.make_case(4, 40, 2, torch.float32, layers=3)
    max_blocks = step.args[1]
    lens = step.tensors[1]
    assert query.shape == (8, cpu_attention_ab.NUM_HEADS, cpu_attention_ab.HEAD_DIM)
    assert int(lens.max()) <= max_blocks * cpu_attention_ab.BLOCK_SIZE
    assert int(lens.min()) >= 2  # every sequence holds its new tokens
    assert k_caches.shape[:2] == (3, 4 * max_blocks)  # one cache per layer
