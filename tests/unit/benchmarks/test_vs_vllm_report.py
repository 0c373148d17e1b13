"""The markdown of a pagedserve / vLLM comparison, built from a canned result: both servers'
medians per level, the machine and the peer, every round's steal; and its place in the
performance summary."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report_writer import build_report
from benchmarks.vs_vllm_report import report, round_ratios


def _level(rate, tok_s, kept) -> dict:
    return {"max_concurrency": None if rate else 16, "request_rate": rate, "output_tok_s": tok_s,
            "ttft_p50_ms": 100.0, "ttft_p99_ms": 300.0, "tpot_p50_ms": 40.0, "tpot_p99_ms": 60.0,
            "rounds_kept": kept, "rounds_thrown_out": []}  # fmt: skip


def canned_result() -> dict:
    return {
        "machine": {"cpu": "AMD EPYC", "num_cpus": 2, "isa_flags": ["avx2"],
                    "lscpu_isa_flags": ["avx2", "fma"], "isa_env": {},
                    "torch_cpu_capability": "AVX2", "loadavg": [0.5, 0.6, 0.7]},
        "workload": {"num_requests": 48, "total_output_tokens": 4000},
        "dtype": "float32", "threads": 2, "max_steal": 0.1, "command": "python -m x",
        "peer": {"vllm": "0.32.0", "torch": "2.9", "torch_cpu_capability": "AVX2",
                 "dtype": "float32", "omp_bind": "0-1", "kv_cache_gib": 3},
        "rounds": {"pagedserve": [{"steal_share": 0.01}, {"steal_share": 0.2}],
                   "vLLM CPU": [{"steal_share": 0.0}, {"steal_share": None}]},
        "medians": {"pagedserve": [_level(None, 300.0, [1, 2]), _level(1.0, 60.0, [1])],
                    "vLLM CPU": [_level(None, 200.0, [1, 2]), _level(1.0, None, [])]},
    }  # fmt: skip


def test_the_report_shows_both_servers_the_peer_and_every_rounds_steal() -> None:
    text = report(canned_result())
    assert "| 16 in flight | 300.0 | 200.0 | 1.50x | 100 / 100 | 300 / 300 | 40 / 40 |" in text
    assert "| 1 req/s | 60.0 | - | - |" in text and text.count("| 1 / 0 |") == 1
    assert "vLLM 0.32.0 CPU build" in text and "bound to 0-1" in text
    assert "pagedserve: 1.0%, 20.0%; vLLM CPU: 0.0%, -" in text
    assert "lscpu flags of note: avx2, fma" in text and "Command: `python -m x`" in text
    assert "48 requests per level, 4000 output tokens" in text  # a result from before `text`
    prose = canned_result()
    prose["workload"]["text"] = "prose"
    assert "48 requests per level (chat requests about prose), 4000" in report(prose)


def test_the_report_is_a_section_of_the_performance_summary(tmp_path: Path) -> None:
    (tmp_path / "vs_vllm.json").write_text(json.dumps(canned_result()))
    summary = build_report(tmp_path)
    assert summary.startswith("## pagedserve vs vLLM's CPU build")
    assert "| 16 in flight | 300.0 | 200.0 | 1.50x |" in summary


def test_the_report_shows_each_servers_start_up_by_round_and_median_peak_memory() -> None:
    result = canned_result()
    result["rounds"]["pagedserve"][0]["footprint"] = {
        "ready_s": 12.34, "peak_rss_gib": 3.0, "settled_pss_gib": 2.0}  # fmt: skip
    result["rounds"]["pagedserve"][1]["footprint"] = {
        "ready_s": 9.0, "peak_rss_gib": 5.0, "settled_pss_gib": 4.0}  # fmt: skip
    text = report(result)
    assert "| pagedserve | 12.3, 9.0 | 4.00 | 3.00 |" in text
    assert "| vLLM CPU |" not in text  # rounds without a footprint: no row


def _point(tok_s, steal=0.0) -> dict:
    return {"output_tok_s": tok_s, "steal_share": steal}


def test_each_rounds_ratio_is_ours_over_the_peers_round_beside_it() -> None:
    result = canned_result()
    result["rounds"] = {
        "pagedserve": [{"steal_share": 0.0, "points": [_point(294.0), _point(60.0)]},
                       {"steal_share": 0.0, "points": [_point(300.0), _point(61.0, 0.5)]},
                       {"steal_share": 0.0, "points": [_point(453.0), _point(62.0)]}],
        "vLLM CPU": [{"steal_share": 0.0, "points": [_point(200.0), _point(None)]},
                     {"steal_share": 0.0, "points": [_point(200.0), _point(50.0)]},
                     {"steal_share": 0.0, "points": [_point(300.0), _point(50.0)]}],
    }  # fmt: skip
    assert round_ratios(result, 0) == [1.47, 1.5, 1.51]
    # a round with no peer figure, or with more than max_steal stolen, has no ratio
    assert round_ratios(result, 1) == [None, None, 1.24]
    text = report(result)
    assert "| 2 / 2 | 1.47 / 1.50 / 1.51x |" in text
    assert "| - / - / 1.24x |" in text


def test_rounds_without_points_or_peer_leave_the_column_empty() -> None:
    result = canned_result()  # its rounds hold only their steal, as a run's before points
    assert round_ratios(result, 0) == [None, None]
    assert text_row(report(result), "16 in flight").endswith("| 2 / 2 | - |")
    del result["rounds"]["vLLM CPU"]
    assert round_ratios(result, 0) == []


def text_row(text: str, level: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {level} |"))
