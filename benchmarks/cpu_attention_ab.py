"""The CPU paged attention kernel (`kernels/cpu_paged_attention.c`) of this tree against the
same kernel at another git revision, call for call on the same inputs, in one process.

    python -m benchmarks.cpu_attention_ab                 # against HEAD
    python -m benchmarks.cpu_attention_ab --base HEAD~3 --threads 2

The two libraries take turns on each case (so a busy machine slows both alike); each line
gives both medians, their ratio, and whether the outputs are bit-identical. Cases are decode
and speculative-verification shapes of SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64,
blocks of 16) at the sequence counts and contexts of the performance suite's workload. Run it
with `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` to build and time the AVX2 code.

Each timed call reads another of `--layers` caches (30, as SmolLM2's layers do in a step), so
its keys and values come from memory as in a model, not from the caches the last call left
warm (`--layers 1` gives the warm figure).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pagedserve.kernels import cpu_build, cpu_paged_attention
from pagedserve.services.gpu_worker.cpu_cache_sizes import l2_bytes_per_core
from pagedserve.services.gpu_worker.platforms.cpu import single_decodes_by_sequence

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
# (sequences, typical context, new tokens per sequence)
CASES = [(1, 176, 1), (16, 176, 1), (16, 176, 4), (32, 300, 4), (64, 300, 1)]
# prefill and mixed steps, bf16 (the kernel's chunks; fp32 prompts go to torch's attention):
# (label, each sequence's context, its new tokens)
PROMPT_CASES = [
    ("6 prompts ~88", [88] * 5 + [60], [88] * 5 + [60]),
    ("prompts 300 + 200", [300, 200], [300, 200]),
    ("16 decodes ~176 + prompt 200", [176] * 16 + [200], [1] * 16 + [200]),
    ("16 decodes ~176 + chunk 64 of 300", [176] * 16 + [300], [1] * 16 + [64]),
    ("prompt 500", [500], [500]),
]


ORDERS = ("machine", "by-sequence", "by-pair")


def build_at_revision(revision: str, directory: Path) -> Path:
    """The kernel's source and the headers beside it as of `revision`, built into
    `directory`. Raises ValueError when `revision` has no such kernel."""
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, "kernels/"], capture_output=True, text=True
    ).stdout.split()
    headers = [Path(path).name for path in listed if path.endswith(".h")]
    for name in ("cpu_paged_attention.c", *headers):
        shown = subprocess.run(
            ["git", "show", f"{revision}:kernels/{name}"], capture_output=True, text=True
        )
        if shown.returncode != 0 and name.endswith(".c"):
            raise ValueError(f"no kernels/{name} at {revision!r}: {shown.stderr.strip()}")
        if shown.returncode == 0:
            (directory / name).write_text(shown.stdout)
    return cpu_build.build(
        directory / "cpu_paged_attention.c", directory, cpu_paged_attention.extra_flags()
    )


def make_case(
    num_seqs: int, context: int, new_tokens: int, dtype: torch.dtype, layers: int, seed: int = 0
):
    """`layers` paged caches with shuffled blocks and contexts spread around `context`."""
    generator = torch.Generator().manual_seed(seed)
    max_len = context + context // 2
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    shape = (layers, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.empty(shape, dtype=dtype).normal_(generator=generator)
    v_cache = torch.empty(shape, dtype=dtype).normal_(generator=generator)
    tables = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    lens = torch.randint(context // 2, max_len, (num_seqs,), generator=generator)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32) * new_tokens
    query = torch.randn(num_seqs * new_tokens, NUM_HEADS, HEAD_DIM, generator=generator)
    step = cpu_paged_attention.prepare(
        tables.view(num_seqs, blocks_per_seq), lens.to(torch.int32), starts
    )
    return step, query.to(dtype), k_cache, v_cache


def make_prompt_case(
    seq_lens: list[int], new_tokens: list[int], dtype: torch.dtype, layers: int, seed: int = 0
):
    """`layers` paged caches with shuffled blocks for sequences of `seq_lens` tokens whose
    last `new_tokens` are this step's."""
    generator = torch.Generator().manual_seed(seed)
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    shape = (layers, sum(blocks), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.empty(shape, dtype=dtype).normal_(generator=generator)
    v_cache = torch.empty(shape, dtype=dtype).normal_(generator=generator)
    shuffled = torch.randperm(sum(blocks), generator=generator).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    for i, chunk in enumerate(shuffled.split(blocks)):
        tables[i, : len(chunk)] = chunk
    starts = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(sum(new_tokens), NUM_HEADS, HEAD_DIM, generator=generator)
    step = cpu_paged_attention.prepare(tables, torch.tensor(seq_lens, dtype=torch.int32), starts)
    return step, query.to(dtype), k_cache, v_cache


def call(library: ctypes.CDLL, step, query, k_cache, v_cache, out) -> None:
    cpu_paged_attention.call_library(library, step, query, k_cache, v_cache, HEAD_DIM**-0.5, out)


def time_pair(base, head, case, repeats: int) -> tuple[float, float, bool]:
    """Median seconds a call of each library (the mean over a pass through the layers'
    caches), the libraries alternating pass by pass; and whether they agree bitwise."""
    step, query, k_caches, v_caches = case
    out_base, out_head = torch.empty_like(query), torch.empty_like(query)
    call(base, step, query, k_caches[0], v_caches[0], out_base)
    call(head, step, query, k_caches[0], v_caches[0], out_head)
    identical = torch.equal(out_base, out_head)
    times: dict[str, list[float]] = {"base": [], "head": []}
    layers = len(k_caches)
    for _ in range(max(1, repeats // layers)):
        for name, library, out in (("base", base, out_base), ("head", head, out_head)):
            start = time.perf_counter()
            for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
                call(library, step, query, k_cache, v_cache, out)
            times[name].append((time.perf_counter() - start) / layers)
    return statistics.median(times["base"]), statistics.median(times["head"]), identical


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare against")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=300, help="calls per library and case")
    parser.add_argument("--layers", type=int, default=30, help="caches the calls rotate over")
    parser.add_argument(
        "--single-decodes", choices=ORDERS, default="machine",
        help="how this tree's kernel attends float32 single-token decodes: as the worker picks "
        "for this machine's L2 (platforms/cpu.py), or forced; a base library keeps its default",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = cpu_paged_attention.load()
    if head is None:
        print("this tree's kernel does not build here", file=sys.stderr)
        return 2
    by_sequence = cpu_paged_attention.set_single_decodes_by_sequence(
        single_decodes_by_sequence(l2_bytes_per_core())
        if args.single_decodes == "machine"
        else args.single_decodes == "by-sequence"
    )
    with tempfile.TemporaryDirectory() as directory:
        try:
            base = ctypes.CDLL(str(build_at_revision(args.base, Path(directory))))
        except (ValueError, cpu_build.KernelBuildError) as exc:
            print(exc, file=sys.stderr)
            return 2
    base.paged_attention.restype = ctypes.c_int
    base.paged_attention.argtypes = head.paged_attention.argtypes
    print(
        f"base {args.base}, {args.threads} threads, {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.layers} caches in turn, this tree's float32 single-token decodes "
        f"{'by sequence' if by_sequence else 'by pair'}"
    )
    print("| seqs | context | new | dtype | base us | this tree us | speed-up | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for num_seqs, context, new_tokens in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            case = make_case(num_seqs, context, new_tokens, dtype, args.layers)
            base_s, head_s, identical = time_pair(base, head, case, args.repeats)
            print(
                f"| {num_seqs} | ~{context} | {new_tokens} | {str(dtype).removeprefix('torch.')} "
                f"| {base_s * 1e6:.0f} | {head_s * 1e6:.0f} | {base_s / head_s:.2f}x "
                f"| {identical} |",
                flush=True,
            )
    for label, seq_lens, new_tokens in PROMPT_CASES:
        case = make_prompt_case(seq_lens, new_tokens, torch.bfloat16, args.layers)
        base_s, head_s, identical = time_pair(base, head, case, args.repeats)
        print(
            f"| {label} | | | bfloat16 | {base_s * 1e6:.0f} | {head_s * 1e6:.0f} "
            f"| {base_s / head_s:.2f}x | {identical} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
