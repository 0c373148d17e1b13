"""xgrammar vs llguidance on pagedserve's cases: compile time for the 20 JSON schemas of
`structured_cases` and the per-step mask time of a batch (64 and 256 sequences) with the
default model's 49152-token vocabulary, the numbers the choice in docs/ARCHITECTURE.md
rests on.

    python -m benchmarks.structured_libraries [--steps 16] [--out benchmarks/results/...]

Each step fills the bitmask of every sequence, then advances each matcher by one token that
its mask allows (a random allowed one, seeded: paths like those of sampling)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.structured_cases import JSON_SCHEMAS, MID_SIZE_SCHEMA
from pagedserve.services.gpu_worker.default_model import ensure_model

_BITS = torch.arange(32, dtype=torch.int32)


def _random_allowed(bitmask_row: torch.Tensor, generator: torch.Generator) -> int:
    """A uniformly random token that the row's bitmask allows (as sampling at temperature 1
    from a flat distribution would pick)."""
    allowed = ((bitmask_row.unsqueeze(1) >> _BITS) & 1).flatten().nonzero().squeeze(1)
    return int(allowed[torch.randint(len(allowed), (1,), generator=generator)])


def measure_xgrammar(tokenizer: Any, vocab_size: int, batch_sizes: list[int], steps: int) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    start = time.perf_counter()
    for schema in JSON_SCHEMAS:
        compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    compile_s = time.perf_counter() - start
    compiled = compiler.compile_json_schema(json.dumps(MID_SIZE_SCHEMA), any_whitespace=False)
    mask_ms = {}
    for batch in batch_sizes:
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        bitmask = xgr.allocate_token_bitmask(batch, vocab_size)
        filler = xgr.BatchGrammarMatcher()
        times = []
        generator = torch.Generator().manual_seed(0)
        for _ in range(steps):
            start = time.perf_counter()
            filler.batch_fill_next_token_bitmask(matchers, bitmask)
            times.append(time.perf_counter() - start)
            for i, matcher in enumerate(matchers):
                if not matcher.is_terminated():
                    matcher.accept_token(_random_allowed(bitmask[i], generator))
        mask_ms[batch] = 1000 * statistics.median(times)
    return {"compile_20_schemas_s": compile_s, "mask_ms_per_step": mask_ms}


def measure_llguidance(tokenizer: Any, vocab_size: int, batch_sizes: list[int], steps: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    options = {"whitespace_flexible": False}
    start = time.perf_counter()
    for schema in JSON_SCHEMAS:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        llguidance.LLMatcher(ll_tokenizer, grammar)  # builds the parser: its "compile"
    compile_s = time.perf_counter() - start
    grammar = llguidance.LLMatcher.grammar_from_json_schema(MID_SIZE_SCHEMA, defaults=options)
    executor = llguidance.LLExecutor()
    mask_ms = {}
    for batch in batch_sizes:
        matchers = [llguidance.LLMatcher(ll_tokenizer, grammar) for _ in range(batch)]
        bitmask = llguidance.torch.allocate_token_bitmask(batch, vocab_size)
        times = []
        generator = torch.Generator().manual_seed(0)
        for _ in range(steps):
            start = time.perf_counter()
            pairs = [(m, i) for i, m in enumerate(matchers)]
            llguidance.torch.fill_next_token_bitmask_par(executor, pairs, bitmask)
            times.append(time.perf_counter() - start)
            for i, matcher in enumerate(matchers):
                if not matcher.is_stopped():
                    matcher.consume_token(_random_allowed(bitmask[i], generator))
        mask_ms[batch] = 1000 * statistics.median(times)
    return {"compile_20_schemas_s": compile_s, "mask_ms_per_step": mask_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model_dir = ensure_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    results = {
        "vocab_size": vocab_size,
        "torch_threads": torch.get_num_threads(),
        "llguidance": measure_llguidance(tokenizer, vocab_size, args.batch_sizes, args.steps),
        "xgrammar": measure_xgrammar(tokenizer, vocab_size, args.batch_sizes, args.steps),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
