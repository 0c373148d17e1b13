"""The greedy pick, `logits.argmax(dim=-1)`, as an op chosen once for the sampler's device."""

from __future__ import annotations

import torch

from pagedserve.kernels import cpu_argmax
from pagedserve.services.gpu_worker.layers.custom_op import CustomOp


class Argmax(CustomOp):
    """bf16 logits are compared in float32 (torch's bf16 argmax is the slowest of all); the
    CPU form is the C kernel (7x torch's in float32, 27x in bf16, for 64 rows of 49152 logits
    on 2 Zen 5 cores). The same index either way."""

    def forward_native(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        return logits.float().argmax(dim=-1)

    def forward_cpu(self, logits: torch.Tensor) -> torch.Tensor:
        if cpu_argmax.supports(logits):
            return cpu_argmax.argmax(logits)
        return self.forward_native(logits)
