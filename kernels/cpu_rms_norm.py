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
    functions=("add_rms_norm", "rms_norm_add", "rms_norm_heads"),
)
load = KERNEL.loader()
DTYPES = (torch.float32, torch.bfloat16)
MAX_HIDDEN = 1 << 14  # the C row buffer's size
MAX_HEAD = MAX_HIDDEN  # the most head_dim rms_norm_heads takes (OLMo 2: a whole projection)


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


def rms_norm_heads_(
    x: torch.Tensor,  # [T, W]: rows whose first heads * head_dim elements are the heads
    heads: int,
    weight: torch.Tensor,  # [head_dim]
    eps: float,
) -> torch.Tensor:
    """Each of the first `heads` heads of every row of x normed in place, with the bits
    `add_rms_norm` gives those heads as a contiguous [T * heads, head_dim] tensor (the CPU
    fused forward norms Qwen3's query and key heads in its qkv rows so). Returns x."""
    head_dim = weight.shape[0]
    if (
        x.dim() != 2 or x.stride(1) != 1 or x.dtype not in DTYPES or weight.dtype != x.dtype
        or heads * head_dim > x.shape[1] or not 0 < head_dim <= MAX_HEAD
    ):  # fmt: skip
        raise ValueError(
            f"needs [T, W] rows of {heads} heads of {head_dim} in the weight's dtype "
            f"({weight.dtype}), head_dim at most {MAX_HEAD}; got {x.dtype} {tuple(x.shape)}"
        )
    library = load()
    if library is None:
        raise RuntimeError("the CPU RMSNorm kernel is not available (see the log)")
    library.rms_norm_heads(
        x.data_ptr(), x.shape[0], x.stride(0), heads, head_dim, weight.data_ptr(), eps,
        int(x.dtype == torch.bfloat16),
    )  # fmt: skip
    return x
