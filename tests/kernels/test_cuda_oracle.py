"""On a CUDA GPU, the compiled kernels in bf16 and fp16 (tensor-core dots, which the CPU
interpreter never runs) against the float64 oracle: decode single-pass and split, prefill,
extend and mixed steps on both prefill grids, at Llama-3-8B head geometry. `make device-check`
runs this file with TRITON_INTERPRET=0; under the interpreter (the test-wide default) it skips,
because it would not test the compiled code."""

from __future__ import annotations

import os

import pytest
import torch

from tests.kernels.oracle import dense_causal_attention_f64
from tests.kernels.paged_case import make_paged_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="tests the compiled kernels: run with TRITON_INTERPRET=0",
    ),
]
# Against float64. The tensor cores take P in the input dtype before the PV product, so the
# error is the dtype's rounding of P and V (bf16: 8 bits of mantissa, fp16: 11).
GPU_TOLERANCES = {
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}
LLAMA8B = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
BATCHES = {
    # name: (seq_lens, query_lens)
    "decode": ([1, 17, 300, 640], [1, 1, 1, 1]),
    "prefill": ([1, 64, 257], [1, 64, 257]),
    "extend": ([200, 333], [37, 129]),
    "mixed": ([420, 96, 300, 511, 1, 77, 640], [300, 1, 1, 1, 1, 1, 1]),
}


def on_cuda(case: object) -> dict[str, torch.Tensor]:
    return {
        name: getattr(case, name).cuda()
        for name in ("query", "k_cache", "v_cache", "block_tables", "query_start_loc", "seq_lens")
    }


def oracle(case: object, seq_lens: list[int], query_lens: list[int]) -> torch.Tensor:
    return dense_causal_attention_f64(
        case.query, case.k_cache, case.v_cache, case.block_tables, query_lens, seq_lens, case.scale
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("grid", ["flat", "padded"])
def test_prefill_kernel_matches_the_f64_oracle(dtype: torch.dtype, batch: str, grid: str) -> None:
    from pagedserve.kernels.paged_prefill import paged_prefill_attention

    seq_lens, query_lens = BATCHES[batch]
    case = make_paged_case(seq_lens, query_lens, **LLAMA8B, block_size=16, dtype=dtype)
    t = on_cuda(case)
    out = paged_prefill_attention(
        t["query"],
        t["k_cache"],
        t["v_cache"],
        t["block_tables"],
        t["query_start_loc"],
        t["seq_lens"],
        case.scale,
        grid=grid,
    )
    torch.testing.assert_close(
        out.double().cpu(), oracle(case, seq_lens, query_lens), **GPU_TOLERANCES[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_decode_kernel_matches_the_f64_oracle(dtype: torch.dtype, num_splits: int | None) -> None:
    from pagedserve.kernels.paged_decode import paged_decode_attention

    seq_lens, query_lens = BATCHES["decode"]
    case = make_paged_case(seq_lens, query_lens, **LLAMA8B, block_size=16, dtype=dtype)
    t = on_cuda(case)
    out = paged_decode_attention(
        t["query"],
        t["k_cache"],
        t["v_cache"],
        t["block_tables"],
        t["seq_lens"],
        case.scale,
        num_splits=num_splits,
    )
    torch.testing.assert_close(
        out.double().cpu(), oracle(case, seq_lens, query_lens), **GPU_TOLERANCES[dtype]
    )
