"""Float32 prompts through the attention kernel's lanes (`kernels/cpu_attention_f32_lanes.h`)
against SDPA, in one process: the in-process engine runs the same work both ways, alternated
round by round, the kernel's `takes_any_chunk` switched off for SDPA (chunks of more than 16
new tokens then go through the modules and SDPA, as before the lanes).

Two workloads: a burst of prompts with one output token each (`prefill_budget`'s: the worst
first token when many prompts arrive at once) and vs_vllm's 96 long-tailed requests with
`--max-num-seqs` in flight (every prompt computed again each run).

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.prompt_lanes_ab --rounds 4 \\
      --out benchmarks/results/prompt_lanes_ab_avx2_fp32.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.kv_memory import build_engine, run_engine
from benchmarks.machine_info import machine_info
from benchmarks.prefill_budget import burst
from benchmarks.vs_transformers_serve import build_parser as workload_parser
from benchmarks.vs_transformers_serve import workload_args
from pagedserve.kernels import cpu_paged_attention
from pagedserve.services.cli.loadgen.runner import build_workload, warmup_requests, write_json

LANES_TAKE = cpu_paged_attention.takes_any_chunk


def use_lanes(on: bool) -> None:
    cpu_paged_attention.takes_any_chunk = LANES_TAKE if on else (lambda dtype, head_dim: False)


def alternate(engine: Any, requests: list[Any], rounds: int) -> dict[str, list[float]]:
    """Seconds per run of `requests`, lanes and SDPA alternated (the order flips each round)."""
    seconds: dict[str, list[float]] = {"lanes": [], "sdpa": []}
    for index in range(rounds):
        for name in ("sdpa", "lanes") if index % 2 == 0 else ("lanes", "sdpa"):
            use_lanes(name == "lanes")
            engine.reset_prefix_cache()
            seconds[name].append(run_engine(engine, requests, trace=False).duration_s)
            print(f"round {index + 1} {name}: {seconds[name][-1]:.2f} s", flush=True)
    use_lanes(True)
    return seconds


def summary(seconds: dict[str, list[float]], per: float, unit: str) -> dict[str, Any]:
    """Medians as `per / seconds` (or seconds * per) in `unit`, and each round's ratio."""
    rate = unit.endswith("/s")
    value = {k: (per / statistics.median(v) if rate else 1e6 * statistics.median(v) / per)
             for k, v in seconds.items()}  # fmt: skip
    ratios = [sdpa / lanes for lanes, sdpa in zip(seconds["lanes"], seconds["sdpa"], strict=True)]
    return {"unit": unit, "lanes": value["lanes"], "sdpa": value["sdpa"],
            "speed_up_by_round": ratios, "seconds": seconds}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prompt_lanes_ab", description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/prompt_lanes_ab.json")
    args = p.parse_args(argv)
    if not LANES_TAKE(torch.float32, 64):
        raise SystemExit("the attention kernel has no float32 lanes here")
    prompts = burst(64, 64, 0.8, 0)
    workload = workload_parser().parse_args(["--num-prompts", "96"])
    requests, tokenizer, model_dir = build_workload(workload_args(workload))
    engine = build_engine(str(model_dir), args.max_num_seqs, None, "float32", args.threads)
    for on in (False, True):  # warm-up both ways
        use_lanes(on)
        run_engine(engine, warmup_requests(requests, tokenizer, 4, 1), trace=False)
    num_prompt_tokens = sum(r.prompt_len for r in prompts)
    print(f"burst: {len(prompts)} prompts, {num_prompt_tokens} tokens")
    result = {"machine": machine_info(), "dtype": "float32", "threads": args.threads,
              "burst": summary(alternate(engine, prompts, args.rounds), num_prompt_tokens,
                               "us per prompt token")}  # fmt: skip
    num_output = run_engine(engine, requests, trace=False).num_output_tokens
    print(f"vs_vllm's workload: {len(requests)} requests, {args.max_num_seqs} in flight")
    seconds = alternate(engine, requests, args.rounds)
    result["workload"] = summary(seconds, num_output, "output tok/s")
    write_json(result, Path(args.out))
    for name in ("burst", "workload"):
        r = result[name]
        print(f"{name}: lanes {r['lanes']:.1f} against SDPA {r['sdpa']:.1f} {r['unit']}; "
              f"by round {', '.join(f'{x:.3f}x' for x in r['speed_up_by_round'])}")  # fmt: skip


if __name__ == "__main__":
    main()
