"""The auto-tool mask benchmark runs and reports every number it promises."""

from __future__ import annotations

from benchmarks.auto_tool_masks import measure


def test_it_reports_compile_and_fill_times():
    result = measure(fills=5)
    assert set(result) == {"tag_compile_ms", "fill_ms_free_text", "fill_ms_inside_call",
                           "fill_ms_json_schema"}  # fmt: skip
    assert all(value > 0 for value in result.values())
