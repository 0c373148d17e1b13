"""The CPU's fused forward pass (`platforms/cpu_fused_forward.py`) against the module path, in
one process: the same in-process engine runs the same seeded workload (vs_vllm's long-tailed
requests, `--max-num-seqs` in flight, every prompt computed again each run) through its fused
pass and through the modules, alternated round by round, so the machine's drift falls on
both alike. Reports output tok/s per run and each round's ratio.

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
      python -m benchmarks.fused_forward_ab --dtype float32 --num-prompts 48 --rounds 4

`--model DIR` runs another model on the same requests (the default model's tokens): a random
one of a public model's shape from `benchmarks.shaped_model`, say.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.kv_memory import build_engine, run_engine
from benchmarks.machine_info import machine_info
from benchmarks.vs_transformers_serve import build_parser as workload_parser
from benchmarks.vs_transformers_serve import workload_args
from pagedserve.services.cli.loadgen.runner import build_workload, warmup_requests


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fused_forward_ab", description=__doc__)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--model", default=None, help="a model directory (default: the default model)")
    budget = "the step token budget (default: the device's, for the fused pass)"
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help=budget)
    args = p.parse_args(argv)
    workload = workload_parser().parse_args(["--num-prompts", str(args.num_prompts)])
    requests, tokenizer, model_dir = build_workload(workload_args(workload))
    model = args.model or str(model_dir)
    engine = build_engine(
        model, args.max_num_seqs, args.max_num_batched_tokens, args.dtype, args.threads
    )
    passes = {"fused": engine.runner.forward_pass, "modules": engine.runner.model}
    if passes["fused"] is passes["modules"]:
        raise SystemExit("no fused forward pass here (see cpu_fused_forward.build)")
    run_engine(engine, warmup_requests(requests, tokenizer, 4, 1), trace=False)
    machine = machine_info()
    print(f"{model}, {args.dtype}, {args.threads} threads, {args.max_num_seqs} in flight, "
          f"ISA caps {machine.get('isa_env')}")  # fmt: skip
    tok_s: dict[str, list[float]] = {name: [] for name in passes}
    for index in range(args.rounds):
        for name in list(passes) if index % 2 == 0 else list(passes)[::-1]:
            engine.runner.forward_pass = passes[name]
            engine.reset_prefix_cache()
            run = run_engine(engine, requests, trace=False)
            tok_s[name].append(run.num_output_tokens / run.duration_s)
            print(f"round {index + 1} {name}: {tok_s[name][-1]:.1f} tok/s, {run.num_steps} steps",
                  flush=True)  # fmt: skip
    engine.runner.forward_pass = passes["fused"]
    ratios = [f / m for f, m in zip(tok_s["fused"], tok_s["modules"], strict=True)]
    print(f"fused / modules by round: {', '.join(f'{r:.3f}x' for r in ratios)}; "
          f"medians {statistics.median(tok_s['fused']):.1f} / "
          f"{statistics.median(tok_s['modules']):.1f} tok/s")  # fmt: skip


if __name__ == "__main__":
    main()
