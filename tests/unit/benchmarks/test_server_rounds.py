"""Servers in alternating rounds: each level from its median round, every round listed."""

from __future__ import annotations

import pytest

from benchmarks.server_rounds import format_rounds, median_run, merge_rounds, rounds_summary


def _run(concurrency: int, tok_s: float) -> dict:
    return {"max_concurrency": concurrency, "output_throughput": tok_s, "ttft_ms": {"p50": tok_s}}


def _round(tok_s_16: float, tok_s_64: float, texts: list[str] | None = None) -> dict:
    return {"runs": [_run(16, tok_s_16), _run(64, tok_s_64)], "texts": texts or []}


def test_the_median_run_carries_its_own_latencies() -> None:
    runs = [_run(16, 90.0), _run(16, 70.0), _run(16, 110.0)]
    assert median_run(runs) is runs[0]
    assert median_run(runs[:2])["output_throughput"] == 70.0  # even count: the lower middle
    with pytest.raises(ValueError, match="no runs"):
        median_run([])


def test_each_level_takes_its_own_median_round() -> None:
    rounds = [_round(90.0, 120.0, ["a"]), _round(100.0, 100.0), _round(80.0, 110.0)]
    merged = merge_rounds(rounds)
    assert [r["output_throughput"] for r in merged["runs"]] == [90.0, 110.0]
    assert merged["runs"][1]["ttft_ms"] == {"p50": 110.0}  # round 3's run, whole
    assert merged["texts"] == ["a"]  # the first round's greedy texts
    assert len(rounds[0]["runs"]) == 2 and rounds[0]["runs"][1]["output_throughput"] == 120.0


def test_rounds_must_measure_the_same_levels() -> None:
    with pytest.raises(ValueError):
        merge_rounds([_round(1.0, 2.0), {"runs": [_run(16, 1.0)]}])
    with pytest.raises(ValueError, match="no rounds"):
        merge_rounds([])


def test_every_round_is_listed_with_its_ratios() -> None:
    ours = [_round(90.0, 120.0), _round(100.0, 110.0)]
    theirs = [_round(30.0, 40.0), _round(40.0, 44.0)]
    summary = rounds_summary(ours, theirs)
    assert summary[1] == {"levels": [16, 64], "pagedserve_tok_s": [100.0, 110.0],
                          "transformers_tok_s": [40.0, 44.0]}  # fmt: skip
    line = format_rounds(summary)
    assert line.startswith("Servers alternated over 2 rounds")
    assert "round 1: 16: 90.0 / 30.0 (3.00x), 64: 120.0 / 40.0 (3.00x)" in line
    assert "round 2: 16: 100.0 / 40.0 (2.50x), 64: 110.0 / 44.0 (2.50x)" in line
    assert format_rounds(summary[:1]) == ""  # one round: the table says it all
