"""The in-process engine of two checkouts, in alternated rounds: did a change make it slower?

Each round runs the same seeded workload once in each checkout (base, head, base, head, ...),
every run a fresh process of that checkout's own virtualenv, so each side loads its own code
and the machine's drift (a neighbour's load on a shared VM) falls on both alike. A run builds
the engine, warms it up on a few requests of fresh words, then runs every request at once
(greedy, `ignore_eos`, so both sides do the same model work) and reports its wall time,
steps and output tokens. The summary gives each side's median and the head/base throughput
ratio of every round.

    python -m benchmarks.revision_ab --base /work/main --rounds 4 --out /tmp/ab.json

The child code below uses only what both checkouts have (`benchmarks.kv_memory`, the
load generator's workload), so the base may be any revision since those existed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.machine_info import machine_info

CHILD = """
import json, sys
from transformers import AutoTokenizer
from benchmarks.kv_memory import build_engine, run_engine
from pagedserve.services.cli.loadgen.workload import LengthDistribution, synthetic_workload
from pagedserve.shared.model_files import resolve_model_dir

args = json.loads(sys.argv[1])
engine = build_engine("smollm2", 256, None, args["dtype"], args["threads"])
tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2"))
def workload(num, seed):
    return synthetic_workload(
        tokenizer, num,
        LengthDistribution(args["prompt_len"], 0.8, 8, 4 * args["prompt_len"]),
        LengthDistribution(args["output_len"], 1.0, 4, 4 * args["output_len"]),
        seed=seed,
    )
run_engine(engine, workload(4, args["seed"] + 1), trace=False)  # warm-up, words of its own
engine.reset_prefix_cache()
run = run_engine(engine, workload(args["num_prompts"], args["seed"]), trace=False)
print(json.dumps({
    "duration_s": run.duration_s, "num_steps": run.num_steps,
    "num_output_tokens": run.num_output_tokens, "num_failed": run.num_failed,
}))
"""


def run_checkout(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One measured run in `checkout`, with its own `.venv`."""
    settings = {k: getattr(args, k) for k in ("dtype", "threads", "prompt_len", "output_len",
                                              "num_prompts", "seed")}  # fmt: skip
    python = checkout / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", CHILD, json.dumps(settings)],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run in {checkout} failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    run["output_throughput"] = run["num_output_tokens"] / run["duration_s"]
    return run


def revision(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip


def summary(base: list[dict[str, Any]], head: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = list(zip(base, head, strict=True))
    ratios = [h["output_throughput"] / b["output_throughput"] for b, h in pairs]
    return {
        "base_tok_s_median": statistics.median(r["output_throughput"] for r in base),
        "head_tok_s_median": statistics.median(r["output_throughput"] for r in head),
        "head_over_base_per_round": ratios,
        "head_over_base_median": statistics.median(ratios),
        "same_work": all(
            (b["num_steps"], b["num_output_tokens"]) == (h["num_steps"], h["num_output_tokens"])
            for b, h in pairs
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the checkout to compare to")
    parser.add_argument("--head", type=Path, default=Path.cwd(), help="default: this one")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    base: list[dict[str, Any]] = []
    head: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        for name, checkout, runs in (("base", args.base, base), ("head", args.head, head)):
            runs.append(run_checkout(checkout, args))
            run = runs[-1]
            print(f"round {number} {name}: {run['output_throughput']:.1f} tok/s "
                  f"({run['duration_s']:.1f} s, {run['num_steps']} steps)", flush=True)  # fmt: skip
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "base_revision": revision(args.base),
        "head_revision": revision(args.head),
        "base_runs": base,
        "head_runs": head,
        "summary": summary(base, head),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
