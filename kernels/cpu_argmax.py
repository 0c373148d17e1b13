"""The argmax of each row of float32 or bf16 logits in one call on the CPU (`cpu_argmax.c`),
built with the machine's C compiler on first use (`kernels/cpu_build.py`) and loaded through
ctypes. Its result is torch's (`Tensor.argmax(dim=-1)`), ties and NaN included.

No compiler, or a failed build: `load()` returns None, says why once in the log, and the
sampler keeps torch's argmax. `PAGEDSERVE_CPU_ARGMAX_KERNEL=0` turns the kernel off.
"""

from __future__ import annotations

import torch

from pagedserve.kernels import cpu_build

KERNEL = cpu_build.CKernel(
    source="cpu_argmax.c",
    switch="PAGEDSERVE_CPU_ARGMAX_KERNEL",
    what="CPU argmax kernel",
    functions=("argmax_rows",),
)
load = KERNEL.loader()
DTYPES = (torch.float32, torch.bfloat16)
MAX_VOCAB = 2**31 - 16  # lanes count indices in int32


def supports(logits: torch.Tensor) -> bool:
    """The kernel can take logits [rows, vocab]: CPU, float32 or bf16, contiguous."""
    return (
        logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.dtype in DTYPES
        and logits.is_contiguous()
        and 0 < logits.shape[1] <= MAX_VOCAB
        and load() is not None
    )


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(dim=-1)` (int64 [rows]). Needs `supports(logits)`."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long)
    if rows:
        load().argmax_rows(
            logits.data_ptr(), rows, vocab, int(logits.dtype == torch.bfloat16), out.data_ptr()
        )
    return out
