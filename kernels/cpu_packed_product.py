"""Calling a packed-weight GEMM of the CPU kernels: `small_gemm` and `small_gemm_amx`
(`cpu_small_gemm.c`, bf16) and `small_sgemm` (`cpu_small_sgemm.c`, float32) share one C
signature, `(x, m, k, x_stride, packed, n, bias, y, y_stride)`, and this is its one call site;
their fused SwiGLU passes, `small_gemm_swiglu` and `small_sgemm_swiglu`, share another,
`(x, m, k, x_stride, packed, n_inter, y, y_stride)`, called from `call_packed_swiglu`.
Both kernels' `pack` write into `packed_buffer`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def packed_buffer(numel: int, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    """Where a weight's panels go: `out` (a slice of an arena) if given, checked to be `numel`
    contiguous elements of `dtype`; else a new tensor."""
    packed = torch.empty(numel, dtype=dtype) if out is None else out
    if packed.dtype != dtype or packed.shape != (numel,) or not packed.is_contiguous():
        raise ValueError(
            f"the packed weight takes {numel} contiguous {dtype} elements, got {packed.dtype} "
            f"{tuple(packed.shape)}"
        )
    return packed


def call_packed_product(
    product: Callable[..., None],  # a library function of the shared signature
    x: torch.Tensor,  # [..., K] in `dtype`, checked by the caller
    packed: torch.Tensor,  # the weight in the product's panel layout
    num_out: int,  # N, the weight's row count
    bias: torch.Tensor | None,  # [N]
    dtype: torch.dtype,  # of x, the bias and the output
) -> torch.Tensor:  # [..., N]
    """x W^T (+ b): rows of x in place (contiguous along K), the bias in `dtype`."""
    num_in = x.shape[-1]
    rows = _rows(x)
    out = torch.empty(rows.shape[0], num_out, dtype=dtype)
    if bias is not None:
        bias = bias.detach().to(dtype).contiguous()
    product(
        rows.data_ptr(), rows.shape[0], num_in, rows.stride(0), packed.data_ptr(), num_out,
        None if bias is None else bias.data_ptr(), out.data_ptr(), num_out,
    )  # fmt: skip
    return out.view(*x.shape[:-1], num_out)


def call_packed_swiglu(
    swiglu: Callable[..., None],  # `small_gemm_swiglu` or `small_sgemm_swiglu`
    x: torch.Tensor,  # [..., K] in `dtype`, checked by the caller
    packed: torch.Tensor,  # the merged [2 * num_inter, K] gate-and-up weight's panels
    num_inter: int,  # the MLP's width
    dtype: torch.dtype,  # of x and the output
) -> torch.Tensor:  # [..., num_inter]
    """silu(x Wg^T) * (x Wu^T): rows of x in place (contiguous along K)."""
    num_in = x.shape[-1]
    rows = _rows(x)
    out = torch.empty(rows.shape[0], num_inter, dtype=dtype)
    swiglu(
        rows.data_ptr(), rows.shape[0], num_in, rows.stride(0), packed.data_ptr(), num_inter,
        out.data_ptr(), num_inter,
    )  # fmt: skip
    return out.view(*x.shape[:-1], num_inter)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [M, K] rows contiguous along K (a view where it already is)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()
