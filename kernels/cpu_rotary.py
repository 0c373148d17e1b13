"""Rotary embedding in place on the CPU (`cpu_rotary.c`), built with the machine's C compiler
on first use (`kernels/cpu_build.py`) and loaded through ctypes.

No compiler, or a failed build: `load()` returns None, says why once in the log, and the
model keeps its torch ops. `PAGEDSERVE_CPU_ROTARY_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import torch

from pagedserve.kernels import cpu_build

KERNEL = cpu_build.CKernel(
    source="cpu_rotary.c",
    switch="PAGEDSERVE_CPU_ROTARY_KERNEL",
    what="CPU rotary embedding kernel",
    functions=("rotate_in_place",),
)
load = KERNEL.loader()
DTYPES = (torch.float32, torch.bfloat16)


def supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The kernel can rotate x [T, H, D] by cos, sin [T, 1, D/2]: CPU, float32 or bf16, heads
    contiguous within a token's row, float32 contiguous angles."""
    return (
        x.device.type == "cpu"
        and x.dtype in DTYPES
        and x.dim() == 3
        and x.shape[-1] % 2 == 0
        and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
        and all(
            a.dtype == torch.float32
            and a.is_contiguous()
            and a.numel() == x.numel() // x.shape[1] // 2
            for a in (cos, sin)
        )
        and load() is not None
    )


def rotate_in_place(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated in place by its tokens' angles ("rotate half"); returns x. Needs
    `supports(x, cos, sin)`."""
    tokens, heads, head_dim = x.shape
    load().rotate_in_place(
        x.data_ptr(), tokens, heads, head_dim, x.stride(0), cos.data_ptr(), sin.data_ptr(),
        int(x.dtype == torch.bfloat16),
    )  # fmt: skip
    return x
