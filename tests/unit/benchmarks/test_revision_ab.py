"""The two-checkout A/B summary: per-round ratios, medians, and whether both sides did the
same work (a change that alters the steps is not a speed comparison)."""

from __future__ import annotations

import pytest

from benchmarks.revision_ab import summary


def run(tok_s: float, steps: int = 100, tokens: int = 500) -> dict:
    return {"output_throughput": tok_s, "num_steps": steps, "num_output_tokens": tokens}


def test_ratios_are_per_round_and_medians_per_side():
    result = summary([run(100), run(80), run(90)], [run(110), run(80), run(99)])
    assert result["head_over_base_per_round"] == pytest.approx([1.1, 1.0, 1.1])
    assert result["head_over_base_median"] == pytest.approx(1.1)
    assert (result["base_tok_s_median"], result["head_tok_s_median"]) == (90, 99)
    assert result["same_work"]


def test_different_work_is_flagged():
    assert not summary([run(100)], [run(100, steps=90)])["same_work"]
    with pytest.raises(ValueError):
        summary([run(100)], [])
