"""How many steps a load level needs, whatever the hardware: a replay of its admission order.

A level of `vs_transformers_serve` keeps C requests in flight: the client sends the next
request when one finishes, so the run cannot end before its last-admitted long requests have
taken their steps one after the other. This replays that schedule on the workload's real
greedy outputs (computed once in-process), with the real n-gram proposer and its
`num_speculative_tokens` / `speculative_max_num_seqs` rules, and counts steps and rows:

    each step: admit requests up to C in flight; a new request's prompt is computed whole and
    yields its first token; a decoding one computes its last token and its drafts (when the
    step holds <= speculative_max_num_seqs sequences) and gains 1 + the drafts that match.

It also drafts in steps that carry a prompt (the scheduler drafts only in pure decode steps),
and it leaves out chunked prefill and the time a step takes, so a real run takes at least
its steps (the in-process engine took 245 where this counts 238, bf16, 16 in flight): a draft
policy that does not lower the count cannot shorten the level. "oracle" drafts are always
right: the floor that no draft source of that length can go below.

Run: python -m benchmarks.draft_replay [--dtype bfloat16] [--concurrency 16,64]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedserve.services.scheduler.ngram_proposer import propose_ngram

Proposer = Callable[[list[int], list[int], int], list[int]]  # (history, future, k) -> drafts


def ngram_drafts(history: list[int], future: list[int], k: int, vocab_size: int = 0) -> list[int]:
    """The scheduler's drafts (`vocab_size` > 0: counts go on, as where the workers report it)."""
    return propose_ngram(history, k, vocab_size=vocab_size)


def oracle_drafts(history: list[int], future: list[int], k: int) -> list[int]:
    return future[:k]


@dataclass(frozen=True)
class Replay:
    steps: int
    rows: int
    drafted: int
    accepted: int
    last_admitted_step: int  # the step the last request entered the batch


def replay_level(
    requests: Sequence[tuple[list[int], list[int]]],  # (prompt ids, greedy output ids)
    in_flight: int,
    num_speculative_tokens: int,
    speculative_max_num_seqs: int,
    propose: Proposer = ngram_drafts,
) -> Replay:
    pending = list(range(len(requests)))
    produced: dict[int, int] = {}  # admitted request -> output tokens so far
    steps = rows = drafted = accepted = last_admitted = 0
    while pending or produced:
        while pending and len(produced) < in_flight:
            produced[pending.pop(0)] = 0
            last_admitted = steps
        drafting = len(produced) <= speculative_max_num_seqs
        for index in list(produced):
            prompt, output = requests[index]
            done = produced[index]
            if done == 0:
                rows += len(prompt)
                produced[index] = 1
            else:
                room = min(num_speculative_tokens, len(output) - done - 1) if drafting else 0
                history = prompt + output[:done]
                drafts = propose(history, output[done:], room) if room > 0 else []
                matched = _matching_prefix(drafts, output[done:])
                rows += 1 + len(drafts)
                drafted += len(drafts)
                accepted += matched
                produced[index] = done + matched + 1
            if produced[index] >= len(output):
                del produced[index]
        steps += 1
    return Replay(steps, rows, drafted, accepted, last_admitted)


def _matching_prefix(drafts: list[int], future: list[int]) -> int:
    matched = 0
    while matched < len(drafts) and drafts[matched] == future[matched]:
        matched += 1
    return matched


def greedy_outputs(args: argparse.Namespace) -> tuple[list[tuple[list[int], list[int]]], int]:
    """The workload of `vs_transformers_serve` (its defaults), its greedy outputs and the
    model's vocabulary size."""
    import torch

    from benchmarks.vs_transformers_serve import build_parser, workload_args
    from pagedserve.services.cli.loadgen.runner import build_workload
    from pagedserve.services.engine import LLMEngine
    from pagedserve.shared.config import SchedulerConfig
    from pagedserve.shared.protocol import SamplingParams

    torch.set_num_threads(args.threads)
    bench_args = build_parser().parse_args(["--num-prompts", str(args.num_prompts)])
    requests, _, model_dir = build_workload(workload_args(bench_args))
    engine = LLMEngine(model_dir, SchedulerConfig(num_speculative_tokens=3), dtype=args.dtype)
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.output_len, min_tokens=r.output_len,
                       ignore_eos=True)
        for r in requests
    ]  # fmt: skip
    results = engine.generate([r.prompt_token_ids for r in requests], params)
    outputs = [(r.prompt_token_ids, o.token_ids) for r, o in zip(requests, results, strict=True)]
    return outputs, engine.shape.vocab_size


POLICIES = (("n-gram", ngram_drafts, 3), ("n-gram", ngram_drafts, 7), ("oracle", oracle_drafts, 3),
            ("oracle", oracle_drafts, 7))  # fmt: skip


TABLE_HEAD = (
    "| in flight | drafts | K | steps | rows | accepted / drafted | last admitted at step |\n"
    "|---|---|---|---|---|---|---|"
)


def report(
    requests: Sequence[tuple[list[int], list[int]]],
    levels: list[int],
    max_seqs: int,
    vocab_size: int = 0,
) -> str:
    lines = [TABLE_HEAD]
    for in_flight in levels:
        for name, policy, k in (("none", ngram_drafts, 0), *POLICIES):
            propose = policy
            if policy is ngram_drafts:
                propose = functools.partial(policy, vocab_size=vocab_size)
            r = replay_level(requests, in_flight, k, max_seqs, propose)
            lines.append(f"| {in_flight} | {name} | {k} | {r.steps} | {r.rows} | "
                         f"{r.accepted} / {r.drafted} | {r.last_admitted_step} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--speculative-max-num-seqs", type=int, default=32)
    args = parser.parse_args(argv)
    requests, vocab_size = greedy_outputs(args)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"{len(requests)} requests, {sum(len(o) for _, o in requests)} output tokens\n")
    print(report(requests, levels, args.speculative_max_num_seqs, vocab_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
