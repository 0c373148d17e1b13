"""Linear layers on the CPU: bf16 weights packed for oneDNN once, at load time; fp32 products
of a few rows computed weight-major.

`F.linear` on bf16 CPU tensors hands the weight to oneDNN, which reorders it into its blocked
layout on every call. For decode batches (a few rows against a large weight) that reorder
costs about as much as the product itself. Packed once, the same product is bit-identical and
measured here (one thread, AVX512-BF16) on SmolLM2's shapes: gate/up 576x3072 at 1 row 146 us
-> 72 us, the LM head 576x49152 at 1 row 6.3 ms -> 3.1 ms, and 8-20% less at 64 rows. This is
what PyTorch's inductor does for CPU linears when it freezes a model.

A layer keeps its plain weight (the tied embedding, tensor-parallel loading and anything that
reads parameters still see it); the packed copy is the layer's `packed_weight`, used by
`linear`. It costs one more copy of the linear weights in memory.

fp32 (MKL's sgemm, what `F.linear` calls) is slow for a few rows against a large weight: its
micro-kernel tiles the rows of x, so 2-32 rows leave most of each FMA's lanes empty while the
weight streams from memory. The same product taken as (W x^T)^T puts the weight's rows where
the tiles are full: measured on SmolLM2's 121 linears in a row (one thread, AVX2 caps, weights
in DRAM as in a decode step), 2 rows 167 -> 115 ms, 3 rows 207 -> 123 ms, 8 rows 159 -> 111 ms,
16 rows 197 -> 129 ms, 32 rows 275 -> 209 ms; one row (a gemv either way) and 64 rows and more
are left to F.linear. Each output is the same dot product; only the order of its partial sums
may differ (a last-bit difference, as between F.linear's own paths for different row counts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def can_prepack(weight: torch.Tensor) -> bool:
    """True for a bf16 weight on a CPU whose oneDNN has bf16 kernels."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of a [out, in] weight (the batch-size hint does not matter here:
    the same packing served 1 to 300 rows equally well)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


WEIGHT_MAJOR_ROWS = (2, 32)  # fp32 row counts computed as (W x^T)^T (see the module's note)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """x W^T (+ b), through the packed weight when the layer has one."""
    if packed_weight is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
    if is_weight_major(x, weight):
        return weight_major_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def is_weight_major(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A few rows of fp32 on the CPU: faster as (W x^T)^T."""
    low, high = WEIGHT_MAJOR_ROWS
    return (
        x.dim() == 2
        and low <= x.shape[0] <= high
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
    )


def weight_major_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x W^T (+ b) computed as (W x^T)^T, returned row-major like F.linear's."""
    if bias is None:
        product = torch.mm(weight, x.t())
    else:
        product = torch.addmm(bias.unsqueeze(1), weight, x.t())
    return product.t().contiguous()


def prepack_linears(model: nn.Module) -> int:
    """Pack every layer of `model` that has a `packed_weight` slot and a packable weight;
    returns how many were packed."""
    num_packed = 0
    for module in model.modules():
        if not hasattr(module, "packed_weight"):
            continue
        weight = module.weight
        if can_prepack(weight):
            module.packed_weight = pack_weight(weight)
            num_packed += 1
    return num_packed
