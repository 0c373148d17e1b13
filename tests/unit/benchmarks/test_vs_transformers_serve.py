"""pagedserve vs transformers serve: one server measured (warm-up, levels, greedy texts)
against a fake server, and the per-level comparison and report built from two results."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from benchmarks.transformers_serve import TransformersServeEndpoint
from benchmarks.vs_transformers_serve import (
    build_parser,
    compare,
    format_comparison,
    measure_server,
    report_section,
    workload_args,
)
from pagedserve.services.cli.loadgen.runner import LoadConfig, plan_levels, warmup_requests
from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload
from tests.unit.benchmarks.fake_openai_server import fake_openai_server
from tests.unit.benchmarks.fake_tokenizer import FakeTokenizer

PROMPTS = LengthDistribution(median=8, sigma=0.5, min_len=4, max_len=20)
OUTPUTS = LengthDistribution(median=3, sigma=0.5, min_len=2, max_len=6)


def test_one_server_is_warmed_measured_per_level_and_checked() -> None:
    tokenizer = FakeTokenizer()
    requests = synthetic_workload(tokenizer, 5, PROMPTS, OUTPUTS, seed=1)
    loads = [LoadConfig(max_concurrency=c) for c in (2, 5)]
    levels = plan_levels(requests, tokenizer, loads, seed=1, synthetic=True)
    warmup = warmup_requests(requests, tokenizer, 3, seed=1 + len(loads))
    with fake_openai_server(send_done=False) as server:
        endpoint = TransformersServeEndpoint(server.base_url, "m")
        result = measure_server(endpoint, levels, warmup, requests[:2])
    assert len(server.prompts) == 3 + 2 * 5 + 2  # warm-up, two levels, the check
    assert [r["max_concurrency"] for r in result["runs"]] == [2, 5]
    assert all(r["num_completed"] == 5 and r["num_wrong_length"] == 0 for r in result["runs"])
    assert result["texts"] == [" x" * r.output_len for r in requests[:2]]
    assert result["warmup"] == {"num_requests": 3, "num_failed": 0}
    if Path("/proc/stat").exists():  # the hypervisor's share of the measured levels
        assert 0.0 <= result["steal_share"] <= 1.0


def _run(concurrency: int, tok_s: float, duration_s: float, ttft: float) -> dict:
    dist = {"p50": ttft, "p99": 2 * ttft}
    return {"max_concurrency": concurrency, "output_throughput": tok_s,
            "duration_s": duration_s, "ttft_ms": dist, "tpot_ms": dict(dist)}  # fmt: skip


def test_levels_compare_throughput_flop_share_and_latency() -> None:
    ours = {"runs": [_run(16, 90.0, 10.0, 100.0), _run(64, 120.0, 7.5, 300.0)]}
    theirs = {"runs": [_run(16, 30.0, 30.0, 400.0), _run(64, 30.0, 30.0, 900.0)]}
    rows = compare(ours, theirs, flops=3e11, flops_per_s=1e11)
    assert [r["speedup"] for r in rows] == [3.0, 4.0]
    assert rows[0]["pagedserve_flop_fraction"] == pytest.approx(0.3)
    assert rows[0]["transformers_flop_fraction"] == pytest.approx(0.1)
    assert rows[1]["ttft_ms_p99"] == {"pagedserve": 600.0, "transformers": 1800.0}
    check = {"num_requests": 16, "num_identical": 16, "mismatches": []}
    table = format_comparison(rows, check)
    assert "| 64 | 120.0 | 30.0 | 4.00x | 40 / 10 | 300 / 900 | 600 / 1800 |" in table
    assert table.endswith("greedy texts identical: 16/16")


def test_levels_must_pair_up() -> None:
    with pytest.raises(ValueError):
        compare({"runs": [_run(16, 1, 1, 1)]}, {"runs": []}, 1.0, 1.0)


def test_report_section_names_the_machine_and_the_hf_ratio() -> None:
    rows = compare({"runs": [_run(16, 90.0, 10.0, 1.0)]}, {"runs": [_run(16, 30.0, 30.0, 1.0)]},
                   3e11, 1e11)  # fmt: skip
    result = {
        "machine": {"cpu": "X", "num_cpus": 2, "isa_flags": ["avx2", "fma"],
                    "isa_env": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                    "torch_cpu_capability": "AVX2"},
        "workload": {"num_requests": 48, "total_output_tokens": 4000},
        "matmul_rate": {"flops_per_s": 9.6e10, "threads": 2},
        "dtype": "float32", "threads": None, "comparison": rows,
        "greedy_check": {"num_requests": 16, "num_identical": 16, "mismatches": []},
        "hf_generate": {"batch_size": 16, "output_throughput": 20.0, "flop_fraction": 0.07},
        "speedup_vs_hf": 4.5,
    }  # fmt: skip
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "flags avx2, fma; ISA caps: MKL_ENABLE_INSTRUCTIONS=AVX2" in text
    assert "96 GFLOP/s on 2 threads" in text and "4.50x" in text and "| 16 | 90.0 |" in text
    assert "stolen" not in text  # results from before steal was recorded
    assert "best of" not in text  # results from before the rate was sampled three times
    result["matmul_rate"]["samples_flops_per_s"] = [7.6e10, 9.6e10, 9e10]
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "96 GFLOP/s on 2 threads (the best of 3 measurements" in text and "76, 96, 90)" in text
    result["pagedserve"] = {"steal_share": 0.02}
    result["transformers_serve"] = {"steal_share": 0.37}
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "stolen by the hypervisor during the measured levels: 2% (pagedserve) / 37%" in text
    assert "pagedserve without speculative decoding" in text
    result["speculative"] = [None, 32]
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "its default n-gram speculative decoding (on a CPU up to 3 draft tokens" in text
    result["speculative"] = [3, 8]
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "up to 3 draft tokens per sequence in steps of at most 8 sequences" in text
    assert "model computed" not in text  # results from before the engine's step clock
    result["pagedserve"]["runs"] = [
        {"max_concurrency": 16, "engine_time": {"execute": 0.81, "in_flight": 0.84,
                                                "scheduling": 0.04}},
        {"max_concurrency": 64, "engine_time": {"execute": 0.9, "in_flight": 0.92,
                                                "scheduling": 0.03}},
    ]  # fmt: skip
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "model computed for 81% / 90% of the wall time at 16 / 64 in flight" in text
    assert "plan out to result in: 84% / 92%; the scheduler between steps: 4% / 3%)" in text
    assert "drafts accepted" not in text
    counts = [(90, 40), (300, 120)]
    for run, (drafts, accepted) in zip(result["pagedserve"]["runs"], counts, strict=True):
        run["engine_time"].update(draft_tokens=drafts, accepted_tokens=accepted)
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "speculative drafts accepted: 40 of 90 / 120 of 300" in text
    for run, steal in zip(result["pagedserve"]["runs"], (0.03, 0.05), strict=True):
        run.update(steal_share=steal, set_aside=[{"steal_share": 0.2}] if steal > 0.04 else [])
    result["transformers_serve"]["runs"] = [{"steal_share": 0.01, "set_aside": []}] * 2
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "stolen by the hypervisor during the kept levels: 3% / 5% (pagedserve) / 1% / 1%" in text
    assert "levels measured again for steal: 1 (pagedserve) / 0 (transformers serve)" in text
    assert "CPU stolen" not in text.split("HF generate")[1]  # results before HF's guard
    result["hf_generate"].update(steal_share=0.06, set_aside=[{"steal_share": 0.25}])
    text = "\n".join(report_section(copy.deepcopy(result)))
    assert "7% of the FLOP limit (6% of the CPU stolen; runs set aside: 1)" in text


def test_workload_args_carry_the_suites_workload() -> None:
    args = workload_args(build_parser().parse_args(["--num-prompts", "48"]))
    assert args.num_prompts == 48 and args.prompt_len_range == [8, 512]
    assert args.output_len_range == [4, 384] and args.dataset is None


def test_saved_result_is_a_section_of_the_performance_report(tmp_path: Path) -> None:
    from benchmarks.report_writer import build_report
    from benchmarks.vs_transformers_serve import save

    rows = compare({"runs": [_run(64, 90.0, 10.0, 1.0)]}, {"runs": [_run(64, 30.0, 30.0, 1.0)]},
                   3e11, 1e11)  # fmt: skip
    result = {
        "machine": {"cpu": "X", "num_cpus": 2, "isa_flags": [], "isa_env": {},
                    "torch_cpu_capability": "AVX512"},
        "workload": {"num_requests": 4, "total_output_tokens": 40},
        "matmul_rate": {"flops_per_s": 1e11, "threads": 1}, "dtype": "bfloat16", "threads": 1,
        "comparison": rows,
        "greedy_check": {"num_requests": 4, "num_identical": 3, "mismatches": [{"index": 2}]},
    }  # fmt: skip
    save(result, tmp_path / "vs_transformers_serve")
    report = build_report(tmp_path)
    assert "## pagedserve vs `transformers serve --continuous-batching`" in report
    assert "| 64 | 90.0 | 30.0 | 3.00x | 30 / 10 |" in report
    assert "greedy texts identical: 3/4" in report
    assert (tmp_path / "vs_transformers_serve.md").read_text() in report


def test_rounds_alternate_the_servers_and_check_texts_once(monkeypatch) -> None:
    import benchmarks.vs_transformers_serve as vs

    order, checks = [], []

    def fake(name: str, tok_s: float):
        def run(args, model_dir, levels, warmup, check, guard):
            order.append(name)
            checks.append(len(check))
            return {"runs": [_run(16, tok_s + len(order), 1.0, 1.0)], "texts": ["t"] * len(check)}

        return run

    monkeypatch.setattr(vs, "run_pagedserve", fake("ours", 90.0))
    monkeypatch.setattr(vs, "run_transformers", fake("theirs", 30.0))
    monkeypatch.setattr(vs, "measured_rate", lambda dtype, threads: {"flops_per_s": 1.0})
    args = build_parser().parse_args(["--rounds", "3"])
    args.dtype_resolved = "float32"
    rates: list = []
    ours, theirs = vs.alternate_servers(args, Path("m"), ([], [], [1, 2], None), rates)
    assert order == ["ours", "theirs"] * 3 and len(rates) == 6 and len(theirs) == 3
    assert checks == [2, 2, 0, 0, 0, 0]  # greedy texts in the first round only
    assert [r["runs"][0]["output_throughput"] for r in ours] == [91.0, 93.0, 95.0]


def test_a_differing_greedy_text_fails_the_run_in_float32_only() -> None:
    from benchmarks.vs_transformers_serve import exit_status

    assert exit_status(False, 0, "float32") == 0
    assert exit_status(False, 1, "float32") == 1
    assert exit_status(False, 8, "bfloat16") == 0  # counted in the report, not a failure
    assert exit_status(True, 0, "bfloat16") == 1
