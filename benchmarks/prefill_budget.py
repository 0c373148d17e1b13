"""What a prompt burst costs in-process at each step token budget: the same prompts (one
output token each, so no decode rows), every one sent at once, through the in-process engine
with `max_num_batched_tokens` set to each budget, in alternated rounds.

The end of such a burst is the worst first token a server gives when many prompts arrive at
once (TTFT p99 at 64 in flight in `vs_vllm`). A larger budget means fewer steps, so fewer
passes of the decodes the burst has started; this measures what it does to the prompts' own
cost per token, apart from the decodes and the service around them.

    python -m benchmarks.prefill_budget --budgets 256,512,1024,2048 --rounds 3 \\
      --out benchmarks/results/prefill_budget.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.kv_memory import build_engine, run_engine
from benchmarks.machine_info import machine_info
from pagedserve.services.cli.loadgen.runner import build_workload, write_json


def burst(num_prompts: int, prompt_len: int, sigma: float, seed: int) -> list[Any]:
    """vs_vllm's long-tailed prompts (median 64, sigma 0.8, 10-320 tokens), one output each."""
    args = SimpleNamespace(
        tokenizer=None, model="smollm2", dataset=None, num_prompts=num_prompts,
        prompt_len=prompt_len, prompt_len_sigma=sigma, prompt_len_range=(10, 320),
        output_len=1, output_len_sigma=0.0, output_len_range=(1, 1), seed=seed,
    )  # fmt: skip
    return build_workload(args)[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefill_budget", description=__doc__)
    p.add_argument("--budgets", default="256,512,1024,2048")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--prompt-len-sigma", type=float, default=0.8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    model = "the engines' model; the prompts are the default model's tokens (for a directory"
    model += " of `benchmarks.shaped_model`, say)"
    p.add_argument("--model", default="smollm2", help=model)
    p.add_argument("--out", default="benchmarks/results/prefill_budget.json")
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    requests = burst(args.num_prompts, args.prompt_len, args.prompt_len_sigma, args.seed)
    engines = {b: build_engine(args.model, 256, b, args.dtype, args.threads) for b in budgets}
    for engine in engines.values():  # warm-up
        run_engine(engine, requests[:8], trace=False)
    runs: dict[int, list[dict[str, float]]] = {b: [] for b in budgets}
    for round_index in range(args.rounds):
        order = budgets if round_index % 2 == 0 else budgets[::-1]
        for budget in order:
            engines[budget].reset_prefix_cache()  # every prompt computed again
            run = run_engine(engines[budget], requests, trace=False)
            runs[budget].append({"duration_s": run.duration_s, "steps": run.num_steps})
            print(f"budget {budget}: {run.duration_s:.2f} s, {run.num_steps} steps", flush=True)
    num_tokens = sum(r.prompt_len for r in requests)
    result = {
        "machine": machine_info(),
        "dtype": args.dtype,
        "threads": args.threads,
        "prompt_tokens": num_tokens,
        "num_prompts": len(requests),
        "budgets": {
            b: {
                "median_s": statistics.median(r["duration_s"] for r in rs),
                "us_per_token": 1e6 * statistics.median(r["duration_s"] for r in rs) / num_tokens,
                "steps": rs[0]["steps"],
                "rounds": rs,
            }
            for b, rs in runs.items()
        },
    }
    write_json(result, Path(args.out))
    for b, r in result["budgets"].items():
        print(f"budget {b}: median {r['median_s']:.2f} s ({r['us_per_token']:.0f} us a token)")


if __name__ == "__main__":
    main()
