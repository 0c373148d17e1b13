"""benchmarks/prefill_budget.py: the burst it sends and one small run through the engine."""

from __future__ import annotations

import json

from benchmarks import prefill_budget


def test_the_burst_is_vs_vllms_prompts_with_one_output_token_each():
    first = prefill_budget.burst(16, 64, 0.8, seed=0)
    assert len(first) == 16
    assert all(r.output_len == 1 and 10 <= r.prompt_len <= 320 for r in first)
    assert len({r.prompt_len for r in first}) > 1  # long-tailed, not one length
    again = prefill_budget.burst(16, 64, 0.8, seed=0)
    assert [r.prompt for r in again] == [r.prompt for r in first]


def test_a_smaller_budget_takes_more_steps_over_the_same_prompts(tmp_path):
    out = tmp_path / "budget.json"
    prefill_budget.main(
        ["--budgets", "32,256", "--num-prompts", "4", "--rounds", "2", "--dtype", "float32",
         "--threads", "1", "--out", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    budgets = result["budgets"]
    assert budgets["32"]["steps"] > budgets["256"]["steps"] >= 1
    assert all(len(b["rounds"]) == 2 and b["median_s"] > 0 for b in budgets.values())
    assert result["prompt_tokens"] == sum(
        r.prompt_len for r in prefill_budget.burst(4, 64, 0.8, seed=0)
    )
