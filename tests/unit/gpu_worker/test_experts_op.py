"""The experts op of `FusedMoE`: its CUDA form is the Triton fused-MoE kernel (here under the
interpreter, on CPU tensors) and gives the native grouping's output; experts the kernel
cannot compute (another activation, expert biases, a platform's linear methods) take the
native grouping on CUDA too."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pagedserve.kernels import fused_moe as fused_moe_kernel
from pagedserve.services.gpu_worker.layers.activation import activation_and_mul
from pagedserve.services.gpu_worker.layers.custom_op import op_form
from pagedserve.services.gpu_worker.layers.fused_moe import ExpertsOp, FusedMoE, kernel_computes
from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.moe_routing import Routing

HIDDEN, INTERMEDIATE = 32, 48


def loaded_moe(routing: Routing, num_experts: int = 8, **kwargs) -> FusedMoE:
    torch.manual_seed(0)
    moe = FusedMoE(HIDDEN, INTERMEDIATE, num_experts, routing, **kwargs)
    for param in moe.parameters():
        param.data.normal_(0, 0.3)
    return moe


def with_form(moe: FusedMoE, form: str) -> FusedMoE:
    moe.compute_experts = ExpertsOp(form=form)
    return moe


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fused kernel's calls (and still runs it)."""
    calls: list[int] = []
    real = fused_moe_kernel.fused_experts

    def counted(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(fused_moe_kernel, "fused_experts", counted)
    return calls


ROUTINGS = [
    Routing(2, renormalize=True),  # Mixtral, Qwen3-MoE
    Routing(4),  # Qwen2-MoE without norm_topk_prob
    Routing(2, num_groups=4, top_groups=2, scaling_factor=16.0),  # DeepSeek-V2
    Routing(4, "sigmoid", True, 4, 2, "top2_sum", 2.5),  # DeepSeek-V3
]


@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("num_tokens", [1, 19])
def test_the_cuda_form_runs_the_kernel_and_matches_native(routing, num_tokens, kernel_calls):
    x = torch.randn(num_tokens, HIDDEN)
    native = with_form(loaded_moe(routing), "native")(x)
    cuda = with_form(loaded_moe(routing), "cuda")(x)
    assert kernel_calls == [num_tokens]
    torch.testing.assert_close(cuda, native, rtol=1e-5, atol=1e-4)  # sums of ~10


def test_the_shared_expert_is_added_on_the_kernel_path(kernel_calls):
    shared = GatedMLP(HIDDEN, 64, "silu", reduce_results=False)
    x = torch.randn(5, HIDDEN)
    native = with_form(loaded_moe(Routing(2), shared_expert=shared), "native")(x)
    cuda = with_form(loaded_moe(Routing(2), shared_expert=shared), "cuda")(x)
    assert kernel_calls == [5]
    torch.testing.assert_close(cuda, native, rtol=1e-5, atol=1e-4)  # sums of ~10


def test_the_op_built_on_a_cuda_default_device_takes_the_cuda_form():
    assert op_form(torch.device("cuda")) == "cuda"
    assert ExpertsOp(form="cuda")._impl.__name__ == "forward_cuda"
    assert ExpertsOp()._impl.__name__ == "forward_cpu"  # built on the CPU here


def expert_bias(moe: FusedMoE) -> None:
    """An expert bias as GPT-OSS's experts have one (what the kernel does not add)."""
    torch.manual_seed(1)
    moe.experts.w13_bias = nn.Parameter(torch.randn(moe.experts.num_experts, 2 * INTERMEDIATE))
    moe.experts.w2_bias = nn.Parameter(torch.randn(moe.experts.num_experts, HIDDEN))


def gelu_experts(moe: FusedMoE) -> None:
    moe.act_and_mul = activation_and_mul("gelu")


def linear_methods(moe: FusedMoE) -> None:
    moe.experts.linear_methods["w2_weight", 0] = PLAIN_LINEAR


@pytest.mark.parametrize("change", [expert_bias, gelu_experts, linear_methods])
def test_experts_the_kernel_cannot_compute_take_the_native_path(change, kernel_calls):
    x = torch.randn(6, HIDDEN)
    native, cuda = (with_form(loaded_moe(Routing(2)), form) for form in ("native", "cuda"))
    change(native)
    change(cuda)
    assert not kernel_computes(cuda.experts, cuda.act_and_mul)
    torch.testing.assert_close(cuda(x), native(x), rtol=1e-6, atol=1e-6)
    assert kernel_calls == []


def test_plain_silu_experts_are_the_kernels():
    moe = loaded_moe(Routing(2))
    assert kernel_computes(moe.experts, moe.act_and_mul)
