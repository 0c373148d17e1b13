"""RMSNorm with its residual add in one call on the CPU (`cpu_rms_norm.c`), built with the
machine's C compiler on first use (`kernels/cpu_build.py`) and loaded through ctypes.

No compiler, or a failed build: `load()` returns None, says why once in the log, and
`RMSNorm` keeps its torch ops. `PAGEDSERVE_CPU_NORM_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import torch

from pagedserve.kernels import cpu_build

KERNEL = cpu_build.CKernel(
    source="cpu_rms_norm.c",
    switch="PAGEDSERVE_CPU_NORM_KERNEL",
    what="CPU RMSNorm kernel",
    functions=("add_rms_norm",),
)
load = KERNEL.loader()
DTYPES = (torch.float32, torch.bfloat16)
MAX_HIDDEN = 1 << 14  # the C row buffer's size


def supports(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
    """The kernel can normalize x (+ residual): CPU, float32 or bf16 like its weight,
    contiguous."""
    return (
        x.device.type == "cpu"
        and (residual is None or (residual.is_contiguous() and residual.shape == x.shape))
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and weight.is_contiguous()
        and 0 < x.shape[-1] == weight.shape[0] <= MAX_HIDDEN
        and load() is not None
    )


def add_rms_norm(
    x: torch.Tensor,  # [..., H]
    residual: torch.Tensor | None,  # x's shape and dtype, or None
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual), as Hugging Face's Llama computes them;
    without a residual, (RMSNorm(x) * weight, x). Needs `supports(x, weight)`."""
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    ):
        raise ValueError(f"residual must be a contiguous {x.dtype} tensor of shape {x.shape}")
    hidden = x.shape[-1]
    out = torch.empty_like(x)
    summed = x if residual is None else torch.empty_like(x)
    status = load().add_rms_norm(
        x.data_ptr(), None if residual is None else residual.data_ptr(), summed.data_ptr(),
        out.data_ptr(), weight.data_ptr(), x.numel() // hidden, hidden, eps,
        int(x.dtype == torch.bfloat16),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"hidden size {hidden} is over the kernel's {MAX_HIDDEN}")
    return out, summed
