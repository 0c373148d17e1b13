"""serve_ab's pieces that need no server: the command line each side runs, and the summary."""

from __future__ import annotations

from pathlib import Path

from benchmarks.serve_ab import CheckoutServeConfig, CheckoutServer, build_parser, summary


def point(concurrency: int, rate: float | None, tok_s: float, ttft: float) -> dict:
    return {"max_concurrency": concurrency, "request_rate": rate, "output_tok_s": tok_s,
            "ttft_p50_ms": ttft, "ttft_p99_ms": 2 * ttft, "tpot_p50_ms": 40.0,
            "tpot_p99_ms": None}  # fmt: skip


def test_a_sides_extra_flags_reach_its_serve_command_line() -> None:
    config = CheckoutServeConfig(Path("/x"), "smollm2", "bfloat16", 2, 60.0,
                                 ("--async-scheduling",))  # fmt: skip
    argv = CheckoutServer(config).child_spec().argv
    assert argv[3:5] == ["/x/.venv/bin/pagedserve", "serve"]
    assert argv[-1] == "--async-scheduling"
    args = build_parser().parse_args(["--base", ".", "--head-args=--async-scheduling",
                                      "--rates", "2,4"])  # fmt: skip
    assert (args.head_args, args.base_args, args.rates) == ("--async-scheduling", "", "2,4")


def test_a_sides_environment_settings_reach_its_server(monkeypatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_CPU_FUSED_FORWARD", "1")
    config = CheckoutServeConfig(Path("/x"), "smollm2", "float32", 2, 60.0,
                                 env=("PAGEDSERVE_CPU_FUSED_FORWARD=0", "X=a=b"))  # fmt: skip
    env = CheckoutServer(config).child_spec().env
    assert env["PAGEDSERVE_CPU_FUSED_FORWARD"] == "0" and env["X"] == "a=b"
    assert env["PAGEDSERVE_NUM_THREADS"] == "2"
    args = build_parser().parse_args(["--base", ".", "--base-env", "A=1 B=2"])
    assert (args.base_env, args.head_env) == ("A=1 B=2", "")


def test_the_summary_names_each_sides_flags_and_gives_latencies_per_level() -> None:
    base = [point(16, None, 300.0, 180.0), point(1, 2.0, 100.0, 90.0)]
    head = [point(16, None, 330.0, 170.0), point(1, 2.0, 101.0, 85.0)]
    result = {"base": "abc base", "head": "abc head", "base_args": "",
              "head_args": "--async-scheduling", "medians": {"base": base, "head": head},
              "ratios_by_round": [[1.1, 1.09], [1.01, 1.0]]}  # fmt: skip
    text = summary(result)
    assert "head: abc head --async-scheduling" in text and "base: abc base\n" in text
    assert "| 16 in flight | 300.0 | 330.0 | 1.100 | [1.1, 1.09] | 180 / 170, 360 / 340 |" in text
    assert "| 2 req/s | 100.0 | 101.0 | 1.010 |" in text
    assert "40 / 40, - / -" in text
