"""The rate plot: the series it draws (rate levels only, sorted, missing medians left out)
and the PNG it writes beside the JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.rate_plots import rate_series, write_rate_plots


def _level(rate: float | None, tok_s: float | None) -> dict:
    return {
        "max_concurrency": None if rate is not None else 16,
        "request_rate": rate,
        "output_tok_s": tok_s,
        "ttft_p99_ms": None if tok_s is None else 10 * tok_s,
        "tpot_p99_ms": 5.0,
    }


CANNED = {
    "pagedserve": [_level(None, 300.0), _level(2.0, 90.0), _level(0.5, 25.0), _level(1.0, None)],
    "vLLM CPU": [_level(None, 250.0), _level(2.0, 80.0), _level(0.5, 24.0), _level(1.0, 48.0)],
}


def test_the_series_holds_the_rate_levels_in_order_without_missing_medians() -> None:
    assert rate_series(CANNED["pagedserve"], "output_tok_s") == ([0.5, 2.0], [25.0, 90.0])
    assert rate_series(CANNED["vLLM CPU"], "ttft_p99_ms") == (
        [0.5, 1.0, 2.0],
        [240.0, 480.0, 800.0],
    )


def test_the_plot_is_a_png_beside_the_json(tmp_path: Path) -> None:
    path = write_rate_plots(CANNED, tmp_path / "vs_vllm_rates.png", "canned")
    assert path == tmp_path / "vs_vllm_rates.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rate level"):
        write_rate_plots({"pagedserve": [_level(None, 1.0)]}, tmp_path / "x.png", "t")
    assert not (tmp_path / "x.png").exists()
