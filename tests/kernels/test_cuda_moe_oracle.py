"""On a CUDA GPU, the compiled fused-MoE kernel (tensor-core dots in bf16/fp16, IEEE fp32
dots in fp32) against the token-by-token experts in float64 on the CPU, at the expert
shapes of Mixtral (8 experts, top 2) and of the fine-grained MoEs (64 experts, top 6);
the experts op's CUDA form against its native grouping on the GPU; and the memory a step
takes against `workspace_bytes`, which the memory profile counts. `make device-check` runs
it with TRITON_INTERPRET=0; under the interpreter it skips (see test_cuda_oracle.py)."""

from __future__ import annotations

import os

import pytest
import torch

from pagedserve.kernels.reference import experts_reference
from pagedserve.services.gpu_worker.layers.moe_routing import Routing, select_experts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="tests the compiled kernels: run with TRITON_INTERPRET=0",
    ),
]
# the hidden rows are stored in the dtype between the two GEMMs: one rounding of each
TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
    torch.bfloat16: {"atol": 4e-2, "rtol": 4e-2},
}
SHAPES = {  # name: (hidden, intermediate, experts, top_k)
    "mixtral-like": (512, 896, 8, 2),
    "fine-grained": (256, 192, 64, 6),
}


def case(shape: str, num_tokens: int, dtype: torch.dtype, seed: int = 0):
    hidden, intermediate, num_experts, top_k = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen)
    w13 = torch.randn(num_experts, 2 * intermediate, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(num_experts, hidden, intermediate, generator=gen) * intermediate**-0.5
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights, ids = select_experts(logits, Routing(top_k, renormalize=True))
    return [t.to(dtype) if t.is_floating_point() else t for t in (x, w13, w2, weights, ids)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("num_tokens", [1, 37, 300])
def test_kernel_matches_float64_experts(dtype, shape, num_tokens):
    from pagedserve.kernels.fused_moe import fused_experts

    inputs = case(shape, num_tokens, dtype)
    out = fused_experts(*(t.cuda() for t in inputs))
    expected = experts_reference(*(t.double() if t.is_floating_point() else t for t in inputs))
    torch.testing.assert_close(out.double().cpu(), expected, **TOLERANCES[dtype])


def test_a_step_takes_no_more_than_the_profiled_workspace():
    from pagedserve.kernels.fused_moe import fused_experts, workspace_bytes

    hidden, intermediate, num_experts, top_k = SHAPES["fine-grained"]
    inputs = [t.cuda() for t in case("fine-grained", 2048, torch.bfloat16)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fused_experts(*inputs)
    torch.cuda.synchronize()
    taken = torch.cuda.max_memory_allocated() - before
    expected = workspace_bytes(2048, top_k, hidden, intermediate, num_experts, torch.bfloat16)
    # the allocator rounds each block up to 512 bytes; align_pairs' index temporaries
    # (int64 copies of the pairs) are freed before the GEMMs' buffers exist
    assert 0.9 * expected <= taken <= expected + 64 * 1024, (taken, expected)
    assert out.shape == (2048, hidden)


@pytest.mark.parametrize("num_tokens", [1, 300])
def test_the_experts_op_cuda_form_equals_native_on_the_gpu(num_tokens):
    from pagedserve.services.gpu_worker.layers.activation import activation_and_mul
    from pagedserve.services.gpu_worker.layers.fused_moe import ExpertsOp, StackedExperts

    x, w13, w2, weights, ids = (t.cuda() for t in case("fine-grained", num_tokens, torch.bfloat16))
    experts = StackedExperts(w13.shape[0], w13.shape[2], w2.shape[2]).to("cuda", torch.bfloat16)
    experts.w13_weight.data.copy_(w13)
    experts.w2_weight.data.copy_(w2)
    act = activation_and_mul("silu")
    with torch.inference_mode():
        cuda = ExpertsOp(form="cuda")(x, experts, weights, ids, act)
        native = ExpertsOp(form="native")(x, experts, weights, ids, act)
    torch.testing.assert_close(cuda.float(), native.float(), **TOLERANCES[torch.bfloat16])
