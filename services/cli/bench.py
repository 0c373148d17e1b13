"""`pagedserve bench`: load-test an OpenAI-compatible server (`services/cli/loadgen/`)."""

from __future__ import annotations

import argparse
import math
import sys

DEFAULT_OUT = "benchmarks/results/serve"


def _float_or_inf(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--dataset", help="JSONL file, one {prompt, output_len} per line")
    g.add_argument("--num-prompts", type=int, default=64)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tokenizer", help="model alias or directory for tokenizing (default: --model)")
    g.add_argument("--prompt-len", type=int, default=128, help="median prompt tokens")
    g.add_argument("--prompt-len-sigma", type=float, default=0.6, help="lognormal sigma")
    g.add_argument("--prompt-len-range", type=_int_list, default=[8, 1024], metavar="MIN,MAX")
    g.add_argument("--output-len", type=int, default=64, help="median output tokens")
    g.add_argument("--output-len-sigma", type=float, default=0.6)
    g.add_argument("--output-len-range", type=_int_list, default=[4, 512], metavar="MIN,MAX")
    g.add_argument("--text", choices=("words", "prose"), default="words",
                   help="what fills a synthetic prompt: random words, or chat requests about "
                   "passages of real English (words flatter n-gram speculation)")  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (throughput, TTFT, TPOT, ITL)",
        description="Stream a seeded workload to an OpenAI-compatible server and report "
        "throughput and latency percentiles; optionally the HF generate baseline on the same "
        "workload. Writes <out>.json and <out>_*.png.",
    )
    add = parser.add_argument
    add("--base-url", default="http://127.0.0.1:8000")
    add("--model", default="smollm2", help="the model name the server serves")
    add("--api-key", default=None)
    add("--endpoint", choices=["completions", "chat"], default="completions")
    add("--request-rate", type=_float_or_inf, default=math.inf, help="Poisson req/s; inf: at once")
    add("--max-concurrency", type=int, default=None, help="at most this many in flight")
    add("--concurrency-sweep", type=_int_list, default=None, metavar="1,4,16,64",
        help="one run per level (overrides --max-concurrency); a synthetic workload gets "
        "fresh words per level, so no level hits the prefix cache another filled")  # fmt: skip
    add(
        "--num-warmups",
        type=_non_negative_int,
        default=8,
        help="unmeasured requests (fresh words) before the first level take the cold start",
    )
    add("--no-ignore-eos", action="store_true", help="let outputs end at EOS")
    add("--redis-url", default=None, help="sample EngineStatus records from this Redis")
    add("--namespace", default="pagedserve")
    add("--metrics-url", default=None, help="sample vllm:* gauges from this /metrics URL")
    add("--ready-timeout", type=float, default=180.0, help="seconds to wait for /health")
    add(
        "--launch",
        action="store_true",
        help="start Redis + scheduler + worker + gateway for --model here, bench it, stop it",
    )
    add("--dtype", default="auto", help="the launched worker's dtype (with --launch)")
    add("--max-num-seqs", type=int, default=256, help="the launched scheduler's (with --launch)")
    add("--worker-threads", type=int, default=None, help="the launched worker's OMP threads")
    add("--label", default="pagedserve")
    add("--out", default=DEFAULT_OUT, help="output path prefix (.json and _*.png)")
    add("--no-plots", action="store_true")
    _add_workload_args(parser)
    hf = parser.add_argument_group("HF baseline")
    hf.add_argument("--hf-baseline", action="store_true", help="also run transformers generate")
    hf.add_argument(
        "--hf-model", default=None, help="model dir for the baseline (default: --tokenizer)"
    )
    hf.add_argument("--hf-dtype", default="auto", help="auto | bfloat16 | float32")
    hf.add_argument("--hf-batch-sizes", type=_int_list, default=[4, 16, 32])
    hf.add_argument("--hf-threads", type=int, default=None, help="torch threads (default: all)")
    hf.add_argument(
        "--hf-device", choices=["cpu", "cuda"], default="cpu", help="where HF generate runs"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pagedserve.services.cli.loadgen.runner import BenchError, run_from_args

    try:
        return run_from_args(args)
    except BenchError as exc:
        print(f"pagedserve bench: error: {exc}", file=sys.stderr)
        return 2
