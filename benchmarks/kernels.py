"""Times the Triton kernels on CUDA against the device's copy bandwidth, checks each against
kernels.reference on the device, and writes a markdown table to
benchmarks/results/kernels_<device>.md.

    python -m benchmarks.kernels            # CUDA only; exits 2 without it
    python -m benchmarks.kernels --smoke    # tiny shapes under the Triton interpreter on CPU

Bandwidth counts the bytes a kernel must move at least once: the KV it reads (each
sequence's context, every KV head), the query and the output; for the cache write, the new
keys/values read and written. The ceiling is a large device-to-device copy timed the same
way (bytes read + bytes written). --smoke exercises every code path with wall-clock timing;
its numbers say nothing about a GPU."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).parent / "results"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}  # max abs error vs the reference


@dataclass(frozen=True, slots=True)
class BenchCase:
    """One timed launch. `context_lens[i]` tokens are cached for sequence i after the step;
    `query_lens[i]` of them are new (1 for a decode)."""

    name: str
    op: str  # "decode", "prefill" or "kv_write"
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    num_splits: int | None = None  # decode only: None = heuristic
    prefill_grid: str = "flat"  # prefill only: "padded" is the grid before the work list


@dataclass(frozen=True, slots=True)
class BenchResult:
    case: BenchCase
    median_us: float
    num_bytes: int
    max_error: float
    num_splits: int | None

    def bandwidth_gbs(self) -> float:
        return self.num_bytes / (self.median_us * 1e-6) / 1e9

    def tflops(self) -> float:
        return attention_flops(self.case) / (self.median_us * 1e-6) / 1e12


def gpu_cases() -> list[BenchCase]:
    llama8b = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16}
    return [
        BenchCase("decode b64 ctx2048", "decode", (2048,) * 64, (1,) * 64, **llama8b, dtype="fp16"),
        BenchCase("decode b64 ctx2048", "decode", (2048,) * 64, (1,) * 64, **llama8b, dtype="bf16"),
        BenchCase(
            "decode b256 ctx512", "decode", (512,) * 256, (1,) * 256, **llama8b, dtype="fp16"
        ),
        BenchCase("decode b1 ctx32k split", "decode", (32768,), (1,), **llama8b, dtype="fp16"),
        BenchCase(
            "decode b1 ctx32k no-split",
            "decode",
            (32768,),
            (1,),
            **llama8b,
            dtype="fp16",
            num_splits=1,
        ),
        BenchCase(
            "decode b4 ctx8k split", "decode", (8192,) * 4, (1,) * 4, **llama8b, dtype="fp16"
        ),
        BenchCase(
            "decode b64 ctx2048 bs32",
            "decode",
            (2048,) * 64,
            (1,) * 64,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=32,
            dtype="fp16",
        ),
        BenchCase("prefill b4 q2048", "prefill", (2048,) * 4, (2048,) * 4, **llama8b, dtype="fp16"),
        *mixed_cases("mixed 4x512 prefill + 60 decodes", (1024,) * 4, (512,) * 4, 60, llama8b),
        # the step of issue 17: one long chunk beside a full decode batch
        *mixed_cases("mixed 1x1792 prefill + 256 decodes", (1792,), (1792,), 256, llama8b),
        BenchCase("kv write 8192 tokens", "kv_write", (8192,), (8192,), **llama8b, dtype="fp16"),
    ]


def mixed_cases(
    name: str,
    chunk_contexts: tuple[int, ...],
    chunk_lens: tuple[int, ...],
    num_decodes: int,
    shape: dict[str, int],
) -> list[BenchCase]:
    """A mixed step (prefill chunks beside decodes of 2048-token contexts) on the flat grid
    and on the padded grid it replaced, for the before/after timing."""
    contexts = chunk_contexts + (2048,) * num_decodes
    query_lens = chunk_lens + (1,) * num_decodes
    return [
        BenchCase(
            f"{name} {grid}",
            "prefill",
            contexts,
            query_lens,
            **shape,
            dtype="bf16",
            prefill_grid=grid,
        )
        for grid in ("flat", "padded")
    ]


def smoke_cases() -> list[BenchCase]:
    tiny = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}
    return [
        BenchCase("decode b2", "decode", (40, 7), (1, 1), **tiny, dtype="fp16"),
        BenchCase("decode b1 split", "decode", (300,), (1,), **tiny, dtype="bf16", num_splits=2),
        BenchCase("mixed", "prefill", (20, 33), (20, 1), **tiny, dtype="fp32"),
        BenchCase(
            "mixed padded",
            "prefill",
            (20, 33),
            (20, 1),
            **tiny,
            dtype="fp32",
            prefill_grid="padded",
        ),
        BenchCase("kv write", "kv_write", (24,), (24,), **tiny, dtype="fp16"),
    ]


def make_inputs(case: BenchCase, device: torch.device) -> dict[str, torch.Tensor]:
    """Caches filled with random data, blocks handed out in random order."""
    dtype = DTYPES[case.dtype]
    bs = case.block_size
    blocks_per_seq = [math.ceil(n / bs) for n in case.context_lens]
    num_blocks = sum(blocks_per_seq)
    shape = (num_blocks, bs, case.num_kv_heads, case.head_dim)
    order = torch.randperm(num_blocks, device=device).to(torch.int32)
    block_tables = torch.zeros(len(blocks_per_seq), max(blocks_per_seq), dtype=torch.int32)
    block_tables = block_tables.to(device)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = order[start : start + n]
        start += n
    query_lens = torch.tensor(case.query_lens, dtype=torch.int32)
    query_start_loc = torch.zeros(len(case.query_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(query_lens, 0)
    num_tokens = int(query_start_loc[-1])
    return {
        "query": torch.randn(num_tokens, case.num_heads, case.head_dim, device=device).to(dtype),
        "key": torch.randn(num_tokens, case.num_kv_heads, case.head_dim, device=device).to(dtype),
        "value": torch.randn(num_tokens, case.num_kv_heads, case.head_dim, device=device).to(dtype),
        "k_cache": torch.randn(shape, device=device).to(dtype),
        "v_cache": torch.randn(shape, device=device).to(dtype),
        "block_tables": block_tables,
        "seq_lens": torch.tensor(case.context_lens, dtype=torch.int32, device=device),
        "query_start_loc": query_start_loc.to(device),
        "slot_mapping": torch.randperm(num_blocks * bs, device=device)[:num_tokens],
    }


def bytes_moved(case: BenchCase, inputs: dict[str, torch.Tensor]) -> int:
    elt = inputs["k_cache"].element_size()
    kv_row = case.num_kv_heads * case.head_dim * elt
    num_tokens = sum(case.query_lens)
    if case.op == "kv_write":
        return 4 * num_tokens * kv_row  # read key and value, write both into the cache
    q_and_out = 2 * num_tokens * case.num_heads * case.head_dim * elt
    return 2 * sum(case.context_lens) * kv_row + q_and_out


def attention_flops(case: BenchCase) -> int:
    """Multiply-adds x 2 of QK^T and PV over the keys each new token attends (causal)."""
    if case.op == "kv_write":
        return 0
    num_pairs = 0
    for seq_len, q_len in zip(case.context_lens, case.query_lens, strict=True):
        prefix = seq_len - q_len
        num_pairs += q_len * prefix + q_len * (q_len + 1) // 2
    return 4 * num_pairs * case.num_heads * case.head_dim


def kv_write_launchers(
    i: dict[str, torch.Tensor],
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    from pagedserve import kernels
    from pagedserve.kernels import reference

    k_ref, v_ref = i["k_cache"].clone(), i["v_cache"].clone()

    def write() -> torch.Tensor:
        kernels.write_kv_cache(i["key"], i["value"], i["k_cache"], i["v_cache"], i["slot_mapping"])
        return i["k_cache"]

    def write_reference() -> torch.Tensor:
        reference.write_kv_cache(i["key"], i["value"], k_ref, v_ref, i["slot_mapping"])
        return k_ref

    return write, write_reference


def launchers(
    case: BenchCase, inputs: dict[str, torch.Tensor]
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(kernel, reference) closures over the inputs, each returning what it wrote: the output,
    or the key cache for a write."""
    from pagedserve import kernels
    from pagedserve.kernels import reference
    from pagedserve.kernels.paged_prefill import build_work_items

    scale = case.head_dim**-0.5
    i = inputs
    if case.op == "kv_write":
        return kv_write_launchers(inputs)
    cache = (i["k_cache"], i["v_cache"], i["block_tables"])
    if case.op == "decode":
        max_len = max(case.context_lens)
        return (
            lambda: kernels.paged_decode_attention(
                i["query"],
                *cache,
                i["seq_lens"],
                scale,
                num_splits=case.num_splits,
                max_seq_len=max_len,
            ),
            lambda: reference.paged_decode_attention(i["query"], *cache, i["seq_lens"], scale),
        )
    max_q = max(case.query_lens)
    locs = (i["query_start_loc"], i["seq_lens"])
    # Built once per step on the host when serving, so outside the timed launch.
    work_items = build_work_items(
        list(case.query_lens),
        list(case.context_lens),
        case.num_heads,
        case.num_kv_heads,
        i["query"].dtype,
        i["query"].device,
    )
    return (
        lambda: kernels.paged_prefill_attention(
            i["query"],
            *cache,
            *locs,
            scale,
            max_query_len=max_q,
            work_items=work_items if case.prefill_grid == "flat" else None,
            grid=case.prefill_grid,
        ),
        lambda: reference.paged_prefill_attention(i["query"], *cache, *locs, scale),
    )


def median_us(fn: Callable[[], object], num_iters: int, device: torch.device) -> float:
    """Median of per-launch times: CUDA events on a GPU, wall clock on the CPU."""
    fn()  # compile and warm up
    if device.type != "cuda":
        times = []
        for _ in range(num_iters):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(num_iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(num_iters)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))


def copy_bandwidth_gbs(device: torch.device, num_bytes: int, num_iters: int) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / (median_us(lambda: dst.copy_(src), num_iters, device) * 1e-6) / 1e9


def run_case(case: BenchCase, device: torch.device, num_iters: int) -> BenchResult:
    torch.manual_seed(0)
    inputs = make_inputs(case, device)
    kernel, reference = launchers(case, inputs)
    error = float((kernel().float() - reference().float()).abs().max())
    elapsed = median_us(kernel, num_iters, device)
    num_splits = case.num_splits
    if case.op == "decode" and num_splits is None:
        from pagedserve.kernels.launch_checks import num_multiprocessors
        from pagedserve.kernels.paged_decode import choose_num_splits

        num_splits = choose_num_splits(
            len(case.context_lens),
            case.num_kv_heads,
            max(case.context_lens),
            num_multiprocessors(device),
        )
    return BenchResult(case, elapsed, bytes_moved(case, inputs), error, num_splits)


def markdown(results: list[BenchResult], device_name: str, copy_gbs: float, smoke: bool) -> str:
    lines = [
        f"# Triton kernels on {device_name}",
        "",
        "Written by `python -m benchmarks.kernels"
        + (" --smoke` (Triton interpreter on CPU: timings are NOT GPU numbers)" if smoke else "`"),
        "",
        f"Copy bandwidth (device-to-device, read + write): {copy_gbs:.1f} GB/s",
        "",
        "| case | op | Hq/Hkv/D | block | dtype | splits | median us | GB/s | % of copy "
        "| TFLOP/s | max abs err | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.case
        ok = r.max_error <= TOLERANCE[c.dtype]
        lines.append(
            f"| {c.name} | {c.op} | {c.num_heads}/{c.num_kv_heads}/{c.head_dim} | "
            f"{c.block_size} | {c.dtype} | {r.num_splits if r.num_splits else '-'} | "
            f"{r.median_us:.1f} | {r.bandwidth_gbs():.1f} | "
            f"{100 * r.bandwidth_gbs() / copy_gbs:.0f}% | {r.tflops():.2f} | {r.max_error:.2e} | "
            f"{'ok' if ok else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def records(results: list[BenchResult], device_name: str, copy_gbs: float) -> dict[str, object]:
    """The table as data, for `benchmarks.device_check`'s summary."""
    rows = [
        {
            "name": r.case.name,
            "op": r.case.op,
            "dtype": r.case.dtype,
            "prefill_grid": r.case.prefill_grid,
            "median_us": r.median_us,
            "bandwidth_gbs": r.bandwidth_gbs(),
            "fraction_of_copy": r.bandwidth_gbs() / copy_gbs,
            "max_error": r.max_error,
            "ok": r.max_error <= TOLERANCE[r.case.dtype],
        }
        for r in results
    ]
    return {"device": device_name, "copy_bandwidth_gbs": copy_gbs, "cases": rows}


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu_interpreter"
    name = torch.cuda.get_device_name(device).lower()
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, interpreter, CPU")
    parser.add_argument("--iters", type=int, default=None, help="timed launches per case")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.smoke:
        # Must precede the first import of a @triton.jit kernel.
        os.environ["TRITON_INTERPRET"] = "1"
        device, cases, num_iters, copy_bytes = torch.device("cpu"), smoke_cases(), 2, 1 << 20
    elif not torch.cuda.is_available():
        print("benchmarks.kernels needs a CUDA device (or --smoke for the CPU interpreter)")
        return 2
    else:
        device, cases, num_iters, copy_bytes = torch.device("cuda"), gpu_cases(), 100, 1 << 30
    num_iters = args.iters or num_iters
    copy_gbs = copy_bandwidth_gbs(device, copy_bytes, num_iters)
    results = []
    for case in cases:
        results.append(run_case(case, device, num_iters))
        r = results[-1]
        print(
            f"{case.name:36s} {case.dtype} {r.median_us:10.1f} us {r.bandwidth_gbs():8.1f} GB/s"
            f" err {r.max_error:.2e}",
            flush=True,
        )
    name = "CPU (Triton interpreter)" if device.type != "cuda" else torch.cuda.get_device_name()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"kernels_{device_slug(device)}.md"
    path.write_text(markdown(results, name, copy_gbs, args.smoke))
    path.with_suffix(".json").write_text(json.dumps(records(results, name, copy_gbs), indent=1))
    print(f"wrote {path} and {path.with_suffix('.json').name}")
    failed = [r.case.name for r in results if r.max_error > TOLERANCE[r.case.dtype]]
    if failed:
        print(f"kernels disagree with the reference: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
