"""KV blocks held by beam search and by parallel sampling (n > 1), against what the same
sequences would hold if no block were shared: the PagedAttention paper's memory-saving figure
(it reports 37-66% saved for beam search with 2-6 beams on its traces).

The workload runs through the in-process engine. After every step, over the running
sequences, `held` counts the distinct blocks they hold and `unshared` the sum of their block
tables' lengths (a shared block counted once per table that holds it: what a cache without
sharing would allocate for the same sequences). The saving is 1 - sum(held) / sum(unshared)
over all steps.

Beam search shares its prompt's and common ancestors' blocks (forks, copy-on-write).
Parallel sampling runs as the gateway sends it, n requests of one prompt in one sample group:
the scheduler admits the first, and the others once it has computed the prompt's full blocks,
which they then hold through the prefix cache (reference-counted, as beams); each computes
only the prompt's last, partial block itself.

    python -m benchmarks.beam_blocks --out benchmarks/results/beam_blocks.json
    python -m benchmarks.beam_blocks --model tests-tiny --out /tmp/beam_blocks.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pagedserve.shared.protocol import GenerateRequest, SamplingParams

PROMPTS = [
    "The history of the printing press begins in",
    "A recipe for a simple tomato soup: first,",
    "In computer science, a hash table is a data structure that",
    "The three most important rules of mountain safety are",
    "Once upon a time, in a small village by the sea, there lived",
    "To configure a web server for HTTPS, you need",
    "The theory of evolution explains how species",
    "My favourite book is about a detective who",
]
TINY = "tests-tiny"  # a random tiny Llama built on the spot (no tokenizer: prompts as ids)


@dataclass(frozen=True)
class BlockCount:
    mode: str  # "beam" | "parallel"
    width: int  # beams, or samples per prompt
    num_steps: int
    held_block_steps: int  # sum over steps of distinct blocks held
    unshared_block_steps: int  # sum over steps of block-table entries
    peak_held: int
    peak_unshared: int
    wall_s: float

    @property
    def saving(self) -> float:
        return 1.0 - self.held_block_steps / max(1, self.unshared_block_steps)


def count_blocks(engine: Any, requests: list[GenerateRequest], mode: str, width: int) -> BlockCount:
    scheduler = engine.scheduler
    for request in requests:
        engine.add_request(request)
    held_sum = unshared_sum = peak_held = peak_unshared = num_steps = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        held = scheduler.num_blocks - scheduler.kv.num_free_blocks
        unshared = sum(scheduler.kv.num_blocks_held(r.request_id) for r in scheduler.running)
        held_sum, unshared_sum = held_sum + held, unshared_sum + unshared
        peak_held, peak_unshared = max(peak_held, held), max(peak_unshared, unshared)
        num_steps += 1
    assert scheduler.kv.num_free_blocks == scheduler.num_blocks, "blocks leaked"
    engine.reset_prefix_cache()  # the next run starts cold
    wall = time.perf_counter() - start
    return BlockCount(mode, width, num_steps, held_sum, unshared_sum, peak_held,
                      peak_unshared, wall)  # fmt: skip


def workload(
    prompts: list[list[int]], mode: str, width: int, max_tokens: int, tag: str
) -> list[GenerateRequest]:
    if mode == "beam":
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, beam_width=width, n=width)
        return [GenerateRequest(f"{tag}-{i}", p, params) for i, p in enumerate(prompts)]
    return [
        GenerateRequest(
            f"{tag}-{i}-{j}",
            p,
            SamplingParams(temperature=1.0, seed=j, max_tokens=max_tokens),
            sample_group=f"{tag}-{i}",  # as the gateway sends the n choices of one prompt
        )
        for i, p in enumerate(prompts)
        for j in range(width)
    ]


def build_engine(model: str, num_blocks: int, max_num_seqs: int) -> Any:
    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import CacheConfig, SchedulerConfig

    if model == TINY:
        from tests.fixtures.tiny_models import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="beam-blocks-")), "llama"))
    return LLMEngine(
        model,
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=2048),
        CacheConfig(block_size=16, num_blocks=num_blocks),
        dtype="float32",
    )


def prompt_ids(engine: Any, num_prompts: int, repeat: int) -> list[list[int]]:
    """Distinct prompts (no two share a block); each sentence said `repeat` times, so that a
    prompt has full blocks (a one-sentence prompt fits in one partial block)."""
    texts = [" ".join([PROMPTS[i % len(PROMPTS)]] * repeat) + f" ({i})" for i in range(num_prompts)]
    if engine.tokenizer is None:  # the tiny model: ids of the texts' bytes
        return [[3 + b % 500 for b in t.encode()] for t in texts]
    return [engine.encode(t) for t in texts]


def run(args: argparse.Namespace) -> dict[str, Any]:
    widths = [int(w) for w in args.widths.split(",")]
    engine = build_engine(args.model, args.num_blocks, args.num_prompts * max(widths))
    prompts = prompt_ids(engine, args.num_prompts, args.prompt_repeat)
    counts = [
        count_blocks(engine, workload(prompts, mode, w, args.max_tokens, f"{mode}{w}"), mode, w)
        for mode in ("beam", "parallel")
        for w in widths
    ]
    return {
        "model": args.model,
        "num_prompts": args.num_prompts,
        "prompt_repeat": args.prompt_repeat,
        "prompt_tokens": [len(p) for p in prompts],
        "max_tokens": args.max_tokens,
        "block_size": 16,
        "runs": [{**asdict(c), "saving": round(c.saving, 4)} for c in counts],
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{'mode':<9}{'width':>6}{'steps':>7}{'held':>10}{'unshared':>10}{'saved':>8}"]
    for r in report["runs"]:
        lines.append(
            f"{r['mode']:<9}{r['width']:>6}{r['num_steps']:>7}{r['held_block_steps']:>10}"
            f"{r['unshared_block_steps']:>10}{r['saving']:>8.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.beam_blocks", description=__doc__)
    p.add_argument("--model", default="smollm2", help=f"a model, or {TINY!r}")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-repeat", type=int, default=8, help="times each sentence is said")
    p.add_argument("--widths", default="2,4,6", help="beams / samples per prompt")
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--out", default="benchmarks/results/beam_blocks.json")
    args = p.parse_args(argv)
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(format_report(report))


if __name__ == "__main__":
    main()
