"""The MLA prefill benchmark runs end to end on a tiny layer: both forms give the same
rows, and each case carries both times and their ratio, with the machine record."""

from __future__ import annotations

import json

from benchmarks.mla_prefill import main


def test_the_benchmark_times_both_forms_per_case(tmp_path):
    out = tmp_path / "mla.json"
    assert main(["--tiny", "--cases", "0:12,20:12", "--rounds", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["case"] for row in report["rows"]] == ["12 over 0", "12 over 20"]
    for row in report["rows"]:
        assert row["absorbed_ms"] > 0 and row["expanded_ms"] > 0
        assert row["absorbed_over_expanded_median"] > 0
        assert row["max_abs_difference"] < 1e-4
    assert "isa_flags" in report["machine"]
