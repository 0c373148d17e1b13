"""The workload flags the server comparisons share (`vs_transformers_serve`, `vs_vllm`): the
suite's seeded long-tailed workload, and the dtype pagedserve resolves "auto" to."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_workload_args(add: Callable[..., Any]) -> None:
    """`add` is a parser's `add_argument`."""
    add("--model", default="smollm2", help="model alias or directory")
    add("--num-prompts", type=int, default=48)
    add("--seed", type=int, default=0)
    add("--prompt-len", type=int, default=64)
    add("--prompt-len-sigma", type=float, default=0.8)
    add("--prompt-len-range", default="8,512")
    add("--output-len", type=int, default=48)
    add("--output-len-sigma", type=float, default=1.0)
    add("--output-len-range", default="4,384")
    add("--text", choices=("words", "prose"), default="words",
        help="prompts of random words, or chat requests about passages of real English (random "
        "words make a small model repeat itself, which flatters n-gram speculation)")  # fmt: skip


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def workload_args(args: argparse.Namespace) -> argparse.Namespace:
    """The fields `services.cli.loadgen.runner.build_workload` reads."""
    return argparse.Namespace(
        model=args.model, tokenizer=None, dataset=None, num_prompts=args.num_prompts,
        seed=args.seed, prompt_len=args.prompt_len, prompt_len_sigma=args.prompt_len_sigma,
        prompt_len_range=ints(args.prompt_len_range), output_len=args.output_len,
        output_len_sigma=args.output_len_sigma, output_len_range=ints(args.output_len_range),
        text=getattr(args, "text", "words"),
    )  # fmt: skip


def resolved_dtype(dtype: str) -> str:
    """The dtype pagedserve's worker picks for `dtype` on this CPU, as a name every server
    accepts (a peer's own "auto" would take the checkpoint's dtype instead)."""
    import torch

    from pagedserve.services.gpu_worker.platforms import resolve_dtype

    return str(resolve_dtype(dtype, torch.device("cpu"))).removeprefix("torch.")
