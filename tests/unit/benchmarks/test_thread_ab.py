"""The OpenMP A/B's variant syntax and its per-round ratios."""

from __future__ import annotations

import pytest

from benchmarks.thread_ab import parse_variant, summarize


def test_variants_are_threads_and_environment() -> None:
    assert parse_variant("2:") == (2, {})
    assert parse_variant("2:OMP_WAIT_POLICY=PASSIVE+GOMP_SPINCOUNT=0") == (
        2, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"},
    )  # fmt: skip
    for bad in ("x:", "0:", "2:NOVALUE"):
        with pytest.raises(ValueError, match="THREADS:NAME=VALUE"):
            parse_variant(bad)


def test_ratios_are_taken_within_a_round_then_the_median() -> None:
    def m(step_ms: float) -> dict:
        return {"step_ms": step_ms, "cpu_s_per_token": step_ms / 1000}

    # the machine slows down 3x in round 2: per-round ratios stay 0.5
    rounds = [[m(100), m(50)], [m(300), m(150)], [m(110), m(55)]]
    first, second = summarize(["1:", "2:"], rounds)
    assert first["step_ratio_to_first"] == 1.0 and second["step_ratio_to_first"] == 0.5
    assert second["step_ms"] == 55 and second["cpu_ms_per_token"] == 55
