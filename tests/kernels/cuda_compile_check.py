"""Compiles every kernel ahead of time for an NVIDIA sm_90 (H100/H200) target, without a GPU,
along the GPU code path (native fp16/bf16 tl.dot, no interpreter), and prints one JSON line
per kernel with facts about the generated PTX. Run in a process without TRITON_INTERPRET:

    python -m tests.kernels.cuda_compile_check
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

from pagedserve.kernels.fused_moe import expert_gemm_kernel
from pagedserve.kernels.kv_cache_write import kv_cache_write_kernel
from pagedserve.kernels.paged_decode import paged_decode_kernel, paged_decode_reduce_kernel
from pagedserve.kernels.paged_prefill import paged_prefill_kernel

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
# Llama-3-8B attention: 32 query heads over 8 KV heads of 128, pages of 16 tokens.
SHAPE = {"HEAD_DIM": 128, "HEAD_PAD": 128, "BLOCK_SIZE": 16}


def signature(
    fn, pointer_types: dict[str, str], constexprs: dict[str, object], also_aligned=()
) -> ASTSource:
    """What a launch with 16-byte aligned tensors and strides divisible by 16 specialises to
    (`also_aligned`: more arguments divisible by 16)."""
    names = fn.arg_names
    types = {}
    for name in names:
        if name in constexprs:
            types[name] = "constexpr"
        else:
            floats = ("scale_log2", "softcap_log2")
            types[name] = pointer_types.get(name, "fp32" if name in floats else "i32")
    aligned = [
        n
        for n in names
        if n.endswith("_ptr")
        or n.startswith(("stride_k", "stride_v", "stride_q", "stride_o"))
        or n in also_aligned
    ]
    return ASTSource(
        fn=fn,
        signature=types,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )


def sources(dtype: str) -> dict[str, ASTSource]:
    upcast = dtype == "fp32"
    tile = 32 if upcast else 64  # launch_checks.tile_size on CUDA
    data = {"query_ptr": f"*{dtype}", "k_cache_ptr": f"*{dtype}", "v_cache_ptr": f"*{dtype}"}
    tables = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "sinks_ptr": "*fp32"}
    decode = {"GROUP": 4, "GROUP_PAD": 16, "TILE_N": tile, "UPCAST": upcast, **SHAPE}
    plain = {"WINDOWED": False, "SOFTCAP": False, "SINKS": False}
    windowed = {"WINDOWED": True, "SOFTCAP": True, "SINKS": False}  # Gemma 2's sliding layers
    sinks = {"WINDOWED": True, "SOFTCAP": False, "SINKS": True}  # GPT-OSS's sliding layers
    out = []
    for split in (False, True):
        ptrs = {**data, **tables, "out_ptr": "*fp32" if split else f"*{dtype}", "lse_ptr": "*fp32"}
        out.append(
            (
                f"decode split={split}",
                signature(paged_decode_kernel, ptrs, {**decode, **plain, "SPLIT": split}),
            )
        )
    ptrs["out_ptr"] = "*fp32"
    decode_windowed = {**decode, **windowed, "SPLIT": True}
    out.append(
        ("decode split=True windowed", signature(paged_decode_kernel, ptrs, decode_windowed))
    )
    ptrs["out_ptr"] = f"*{dtype}"
    decode_sinks = {**decode, **sinks, "SPLIT": False}
    out.append(
        ("decode split=False windowed sinks", signature(paged_decode_kernel, ptrs, decode_sinks))
    )
    ptrs = {
        **data,
        **tables,
        "out_ptr": f"*{dtype}",
        "query_start_loc_ptr": "*i32",
        "work_items_ptr": "*i32",
    }
    prefill = {"GROUP": 4, "GROUP_PAD": 4, "BLOCK_Q": tile // 4, "TILE_N": tile, "UPCAST": upcast}
    prefill.update(SHAPE)
    for flat, name, masks in (
        (True, "prefill", plain),
        (False, "prefill padded grid", plain),
        (True, "prefill windowed", windowed),
        (True, "prefill windowed sinks", sinks),
    ):
        constexprs = {**prefill, **masks, "NUM_KV_HEADS": 8, "FLAT_GRID": flat}
        out.append((name, signature(paged_prefill_kernel, ptrs, constexprs)))
    ptrs = {"out_ptr": f"*{dtype}", "partial_ptr": "*fp32", "lse_ptr": "*fp32"}
    ptrs["sinks_ptr"] = "*fp32"
    reduce = {"SPLITS_PAD": 8, "HEAD_DIM": 128, "HEAD_PAD": 128, "SINKS": False}
    out.append(("decode reduce", signature(paged_decode_reduce_kernel, ptrs, reduce)))
    reduce_sinks = {**reduce, "SINKS": True}
    out.append(("decode reduce sinks", signature(paged_decode_reduce_kernel, ptrs, reduce_sinks)))
    ptrs = {n: f"*{dtype}" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    write = {"NUM_KV_HEADS": 8, "HEADS_PAD": 8, **SHAPE}
    out.append(
        ("kv write", signature(kv_cache_write_kernel, {**ptrs, "slot_mapping_ptr": "*i64"}, write))
    )
    out += moe_sources(dtype)
    return dict(out)


def moe_sources(dtype: str) -> list[tuple[str, ASTSource]]:
    """The fused-MoE GEMM's two forms (gate/up with SiLU, down with the routing weights) at
    a prefill's widest blocks (kernels/fused_moe.launch's tiles for the dtype)."""
    ptrs = {n: f"*{dtype}" for n in ("a_ptr", "w_ptr", "out_ptr", "weights_ptr")}
    ptrs.update(sorted_pairs_ptr="*i32", block_experts_ptr="*i32")
    tiles = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32} if dtype == "fp32" else {
        "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}  # fmt: skip
    out = []
    for name, gated, rows_per_a in (("moe gate/up", True, 2), ("moe down", False, 1)):
        constexprs = {"ROWS_PER_A": rows_per_a, "GATED": gated, "SCALE_BY_WEIGHT": not gated,
                      "UPCAST": dtype == "fp32", **tiles}  # fmt: skip
        aligned = ("stride_am", "stride_we", "stride_wn", "N", "K")
        out.append((name, signature(expert_gemm_kernel, ptrs, constexprs, aligned)))
    return out


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread and stack (local memory, where spills go) bytes per thread."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump output: {text[-500:]}")
    return {"registers": int(found[1]), "stack_bytes": int(found[2])}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles for the GPU")
    for dtype in ("fp16", "bf16", "fp32"):
        for name, source in sources(dtype).items():
            # launch_checks.decode_num_warps: fp32 decode spreads its tiles over 8 warps
            warps = 8 if dtype == "fp32" and name.startswith("decode split") else 4
            if name.startswith("moe") and dtype != "fp32":  # fused_moe.choose_tiles' widest
                warps = 8
            kernel = triton_compile(source, target=TARGET, options={"num_warps": warps})
            ptx = kernel.asm["ptx"]
            facts = {
                "kernel": name,
                "dtype": dtype,
                "shared_bytes": kernel.metadata.shared,
                "cp_async": len(re.findall(r"cp\.async\.", ptx)),
                "mma": len(re.findall(r"\bmma\.sync\b|\bwgmma\.", ptx)),
                **resource_usage(kernel.asm["cubin"]),
            }
            print(json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
