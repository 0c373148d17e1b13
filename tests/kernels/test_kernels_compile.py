"""The GPU code path compiles, with no GPU: every kernel in every dtype is compiled ahead of
time for sm_90 (H100/H200) by Triton's own ptxas, in a process without the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_all_kernels_compile_for_sm90_with_pipelined_tensor_core_attention() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.cuda_compile_check"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    facts = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    # 3 dtypes x (decode, decode split, prefill, prefill padded grid, reduce, write, 2 MoE,
    # and the windowed, soft-capped and sink variants)
    assert len(facts) == 3 * 13
    attention = [f for f in facts if f["kernel"].startswith(("decode split", "prefill"))]
    assert len(attention) == 3 * 8  # plain, windowed + soft-capped, windowed + sinks
    for fact in attention:
        # KV tiles stream through shared memory asynchronously (software pipelining) ...
        assert fact["cp_async"] > 0, fact
        # ... and fp16/bf16 run on the tensor cores; fp32 uses IEEE FMA dots by design.
        assert (fact["mma"] > 0) == (fact["dtype"] != "fp32"), fact
        # No register spills to local memory, fp32 included (its smaller tiles fit).
        assert fact["stack_bytes"] == 0, fact
    moe = [f for f in facts if f["kernel"].startswith("moe")]
    assert len(moe) == 3 * 2
    for fact in moe:  # the expert GEMMs: tensor cores for fp16/bf16
        assert (fact["mma"] > 0) == (fact["dtype"] != "fp32"), fact
        # fp32 fits; the fp16/bf16 128 x 128 tiles on 8 warps spill a few hundred bytes in
        # this ahead-of-time build (no launch-time specialisation), and were still the
        # fastest measured on an H200 (kernels/fused_moe.choose_tiles)
        assert fact["stack_bytes"] == 0 or fact["dtype"] != "fp32", fact
