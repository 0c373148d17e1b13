"""What structured outputs cost, on the in-process engine with the default model:

- throughput of a 64-request batch with a quarter of it constrained by a mid-size JSON schema,
  against the same batch unconstrained (generated tokens per second, same run);
- the per-step grammar work at batch 64 and 256 (matcher catch-up + bitmask fill + applying
  the mask to the logits), against the decode step time measured in the same run;
- time to first token of a request whose schema is seen for the first time vs a cached one.

    python -m benchmarks.structured_outputs [--max-tokens 48] [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from benchmarks.structured_cases import MID_SIZE_SCHEMA
from benchmarks.structured_libraries import _random_allowed
from pagedserve.services.engine import LLMEngine
from pagedserve.services.gpu_worker.grammar_book import GrammarBook
from pagedserve.services.gpu_worker.sampler import AllowedTokens, apply_allowed_tokens
from pagedserve.shared.config import SchedulerConfig
from pagedserve.shared.protocol import GenerateRequest, SamplingParams, StructuredOutput

MID_SPEC = StructuredOutput("json", json.dumps(MID_SIZE_SCHEMA, sort_keys=True))
PROMPT = "Write a JSON record describing a user of a web application, with an address."


def run_batch(engine: LLMEngine, num_constrained: int, batch: int, max_tokens: int) -> dict:
    """Tokens/s of one batch; step times of the steps where every sequence decodes."""
    engine.reset_prefix_cache()
    for i in range(batch):
        spec = MID_SPEC if i < num_constrained else None
        sampling = SamplingParams(
            temperature=1.0, seed=i, max_tokens=max_tokens, structured_output=spec,
            ignore_eos=spec is None,
        )  # fmt: skip
        engine.add_request(
            GenerateRequest(f"b{num_constrained}-{i}", engine.encode(PROMPT), sampling)
        )
    num_tokens, step_times = 0, []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        step_start = time.perf_counter()
        deltas = engine.step()
        if all(len(d.token_ids) <= 1 for d in deltas) and len(deltas) == batch:
            step_times.append(time.perf_counter() - step_start)
        num_tokens += sum(len(d.token_ids) + (d.stop_token_id is not None) for d in deltas)
    elapsed = time.perf_counter() - start
    return {
        "tokens": num_tokens,
        "seconds": elapsed,
        "tokens_per_s": num_tokens / elapsed,
        "median_full_decode_step_ms": 1000 * statistics.median(step_times) if step_times else None,
    }


def mask_step_ms(engine: LLMEngine, batch: int, steps: int) -> dict:
    """Median per-step grammar work for `batch` sequences all constrained by MID_SPEC."""
    book = GrammarBook(engine.runner.grammars.compiler)
    eos = engine.eos_token_ids
    sampling = SamplingParams(structured_output=MID_SPEC, eos_token_ids=eos)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    for i in range(batch):
        book.track(f"m{i}", sampling)
    book.compiler.compile(MID_SPEC).result()
    vocab = engine.runner.vocab_size
    logits = torch.randn(batch, vocab)
    generator = torch.Generator().manual_seed(0)
    fill_ms, apply_ms = [], []
    for _ in range(steps):
        start = time.perf_counter()
        masks = book._masks([(i, book._slots[f"m{i}"], outputs[i]) for i in range(batch)])
        fill_ms.append(1000 * (time.perf_counter() - start))
        assert masks.bitmask is not None and not masks.deferred_rows
        start = time.perf_counter()
        apply_allowed_tokens(logits, AllowedTokens(masks.row_ids, masks.bitmask), copy=False)
        apply_ms.append(1000 * (time.perf_counter() - start))
        for row, out in zip(masks.row_ids, outputs, strict=True):
            token = _random_allowed(masks.bitmask[row], generator)
            if token not in eos:
                out.append(token)
    return {"fill_ms": statistics.median(fill_ms), "apply_ms": statistics.median(apply_ms)}


def ttft(engine: LLMEngine, spec: StructuredOutput) -> float:
    """Seconds from submitting one request to its first generated token."""
    request_id = f"t-{uuid.uuid4().hex[:8]}"
    sampling = SamplingParams(temperature=0.0, max_tokens=8, structured_output=spec)
    start = time.perf_counter()
    engine.add_request(GenerateRequest(request_id, engine.encode(PROMPT), sampling))
    first = None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if first is None and (delta.token_ids or delta.finished):
                first = time.perf_counter() - start
    assert first is not None
    return first


def fresh_schema_spec() -> StructuredOutput:
    schema = json.loads(MID_SPEC.spec)
    schema["properties"][f"field_{uuid.uuid4().hex[:6]}"] = {"type": "boolean"}
    return StructuredOutput("json", json.dumps(schema, sort_keys=True))


def cpu_flags() -> dict[str, Any]:
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    isa = [f for f in flags if f.startswith(("avx", "amx", "sse4", "fma", "f16c"))]
    return {"model": fields.get("Model name", "").strip(), "isa_flags": isa}


def throughput_rounds(engine: LLMEngine, rounds: int, max_tokens: int) -> dict[str, Any]:
    """The same 64-request batch unconstrained and with 16 constrained, alternated `rounds`
    times after a warm-up batch (the first batch of a process pays one-time costs, and the
    machine's load drifts over both alike); the ratio of each pair, and their median."""
    run_batch(engine, 0, 64, 8)  # warm-up: not measured
    pairs = [
        (run_batch(engine, 0, 64, max_tokens), run_batch(engine, 16, 64, max_tokens))
        for _ in range(rounds)
    ]
    ratios = [c["tokens_per_s"] / u["tokens_per_s"] for u, c in pairs]
    return {
        "unconstrained": [u for u, _ in pairs],
        "quarter_constrained": [c for _, c in pairs],
        "throughput_ratios": ratios,
        "throughput_ratio": statistics.median(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--mask-steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="unconstrained/constrained pairs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    engine = LLMEngine("smollm2", SchedulerConfig(max_model_len=512, max_num_seqs=256))
    ttft(engine, MID_SPEC)  # warm: imports, tokenizer info, the mid-size schema
    results: dict[str, Any] = {"cpu": cpu_flags(), "torch_threads": torch.get_num_threads()}
    results.update(throughput_rounds(engine, args.rounds, args.max_tokens))
    results["mask_step"] = {b: mask_step_ms(engine, b, args.mask_steps) for b in (64, 256)}
    # What a step of the same batch costs without grammars, to set the mask time against.
    results["decode_step_ms"] = {
        64: statistics.median(r["median_full_decode_step_ms"] for r in results["unconstrained"]),
        256: run_batch(engine, 0, 256, 8)["median_full_decode_step_ms"],
    }
    results["mask_share_of_step"] = {
        b: (m["fill_ms"] + m["apply_ms"]) / results["decode_step_ms"][b]
        for b, m in results["mask_step"].items()
    }
    first_seen = fresh_schema_spec()
    results["ttft_s"] = {
        "first_seen_schema": ttft(engine, first_seen),
        "cached_schema": ttft(engine, first_seen),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
