"""The attention-sinks benchmark runs end to end at a tiny size on the CPU: both forms agree
with the reference (checked before timing, errors reported) and every row carries both
times and their ratio, with the machine record."""

from __future__ import annotations

import json

from benchmarks.attention_sinks import main


def test_the_benchmark_reports_both_cpu_forms_per_case(tmp_path):
    out = tmp_path / "sinks.json"
    assert main(["--context", "40", "--rounds", "1", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(row["case"], row["window"]) for row in report["rows"]] == [
        ("decode 8 x 40", None), ("decode 8 x 40", 128),
        ("prefill 10 over 30", None), ("prefill 10 over 30", 128),
    ]  # fmt: skip
    for row in report["rows"]:
        assert row["eager_ms"] > 0 and row["fused_ms"] > 0 and row["fused_over_eager"] > 0
        assert max(row["max_abs_error_vs_reference"].values()) < 1e-5
    assert "isa_flags" in report["machine"]
