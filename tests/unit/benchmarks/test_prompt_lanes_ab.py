"""benchmarks/prompt_lanes_ab.py: its switch between the float32 lanes and SDPA, and its sums."""

from __future__ import annotations

import pytest
import torch

from benchmarks import prompt_lanes_ab
from pagedserve.kernels import cpu_paged_attention


def test_the_switch_sends_long_float32_chunks_to_sdpa_and_back():
    if not prompt_lanes_ab.LANES_TAKE(torch.float32, 64):
        pytest.skip("no C compiler: no kernel to switch")
    try:
        prompt_lanes_ab.use_lanes(False)
        assert cpu_paged_attention.max_query_len(torch.float32, 64) == 16
    finally:
        prompt_lanes_ab.use_lanes(True)
    assert cpu_paged_attention.max_query_len(torch.float32, 64) is None


def test_summary_gives_medians_per_unit_and_each_rounds_speed_up():
    seconds = {"lanes": [2.0, 4.0, 3.0], "sdpa": [3.0, 4.0, 6.0]}
    rate = prompt_lanes_ab.summary(seconds, 600.0, "output tok/s")
    assert rate["lanes"] == 200.0 and rate["sdpa"] == 150.0
    assert rate["speed_up_by_round"] == [1.5, 1.0, 2.0]
    cost = prompt_lanes_ab.summary(seconds, 1000.0, "us per prompt token")
    assert cost["lanes"] == 3000.0 and cost["sdpa"] == 4000.0
