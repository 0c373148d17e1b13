"""The MoE grouping benchmark runs end to end at a tiny size: both paths agree (it checks
before timing) and every row carries both times and their ratio, with the machine record."""

from __future__ import annotations

import json

import torch

from benchmarks.moe_grouping import main, per_token_experts
from pagedserve.services.gpu_worker.layers.activation import SiluAndMul
from pagedserve.services.gpu_worker.layers.fused_moe import StackedExperts, grouped_experts


def test_the_baseline_computes_what_the_grouped_path_does():
    experts = StackedExperts(4, 16, 12)
    experts.w13_weight.data.normal_()
    experts.w2_weight.data.normal_()
    x, weights, ids = torch.randn(7, 16), torch.rand(7, 2), torch.randint(0, 4, (7, 2))
    act = SiluAndMul()
    torch.testing.assert_close(
        per_token_experts(x, experts, weights, ids, act),
        grouped_experts(x, experts, weights, ids, act),
        rtol=1e-4,
        atol=1e-4,
    )


def test_the_benchmark_reports_both_paths_per_token_count(tmp_path):
    out = tmp_path / "moe.json"
    argv = ["--tokens", "1,5", "--hidden", "32", "--intermediate", "48", "--experts", "4",
            "--rounds", "1", "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert [row["tokens"] for row in report["rows"]] == [1, 5]
    for row in report["rows"]:
        assert row["grouped_ms"] > 0 and row["per_token_ms"] > 0
        assert row["speedup"] > 0
    assert "isa_flags" in report["machine"]
