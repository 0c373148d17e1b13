"""`pagedserve generate`: offline batch generation with the in-process engine, prompts from a
text file (one per line) or JSONL (`{"prompt": "..."}` or `{"prompt_token_ids": [...]}`,
optional per-line `max_tokens`, `temperature`, `top_p`, `seed`), results as JSONL."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from pagedserve.shared.options import add_options, use
from pagedserve.shared.protocol import SamplingParams

# The engine's flags, from the one option table (with an offline engine's defaults).
GENERATE_OPTIONS = (
    use("model", help=None),
    use("dtype", choices=("auto", "float32", "bfloat16")),
    use("max_num_seqs", default=64),
    use("max_num_batched_tokens", help="default: 512 CPU (1024 bf16 without AMX), 2048 CUDA"),
    use("max_model_len", default=2048, help=None),
    use("num_blocks", help=None),
)
_PER_LINE_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "min_tokens")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate completions for a file of prompts, offline (no Redis, no services)",
        description="Run every prompt of a .txt (one per line) or .jsonl file through the "
        "in-process engine as one continuous batch and write one JSON line per prompt.",
    )
    parser.add_argument("--prompts", required=True, type=Path, help=".txt or .jsonl")
    parser.add_argument("--output", required=True, type=Path, help="where the JSONL goes")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")
    add_options(parser, *GENERATE_OPTIONS)
    parser.set_defaults(func=run)


def read_prompts(path: Path, base: SamplingParams) -> tuple[list[Any], list[SamplingParams]]:
    """Prompts and per-prompt sampling from a .txt or .jsonl file."""
    if not path.is_file():
        raise ValueError(f"prompts file {path} does not exist")
    prompts: list[Any] = []
    params: list[SamplingParams] = []
    lines = path.read_text().splitlines()
    if path.suffix != ".jsonl":
        prompts = [line for line in lines if line.strip()]
        return prompts, [base] * len(prompts)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record.get("prompt_token_ids", record.get("prompt"))
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f"{path}:{number}: not a JSON object: {exc}") from exc
        if not prompt:
            raise ValueError(f"{path}:{number}: needs a non-empty 'prompt' or 'prompt_token_ids'")
        overrides = {k: record[k] for k in _PER_LINE_FIELDS if k in record}
        sampling = dataclasses.replace(base, **overrides)
        sampling.validate()
        prompts.append(prompt)
        params.append(sampling)
    return prompts, params


def run(args: argparse.Namespace) -> int:
    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import CacheConfig, SchedulerConfig

    base = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
    try:
        base.validate()
        prompts, params = read_prompts(args.prompts, base)
        engine = LLMEngine(
            args.model,
            SchedulerConfig(
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_model_len=args.max_model_len,
            ),
            CacheConfig(num_blocks=args.num_blocks),
            dtype=args.dtype,
            show_progress=True,
        )
        start = time.perf_counter()
        results = engine.generate(prompts, params)
    except (ValueError, FileNotFoundError) as exc:
        print(f"pagedserve generate: error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w") as out:
        for prompt, result in zip(prompts, results, strict=True):
            record = {
                "prompt": prompt,
                "text": result.text,
                "token_ids": result.token_ids,
                "finish_reason": result.finish_reason,
                "num_prompt_tokens": len(result.prompt_token_ids),
                "num_cached_tokens": result.num_cached_tokens,
            }
            if result.error:
                record["error"] = result.error
            out.write(json.dumps(record) + "\n")
    num_tokens = sum(len(r.token_ids) for r in results)
    print(
        f"{len(results)} prompts, {num_tokens} tokens in {elapsed:.2f}s "
        f"({num_tokens / max(elapsed, 1e-9):.1f} tok/s) -> {args.output}",
        file=sys.stderr,
    )
    return 0
