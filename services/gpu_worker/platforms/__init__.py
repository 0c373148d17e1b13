"""Platforms: the seam between the worker and the machine it runs on (see `base.py`)."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.platforms.base import BasePlatform

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def get_platform(device: torch.device) -> BasePlatform:
    """The platform of `device`; a device type without one is refused naming it."""
    if device.type == "cpu":
        from pagedserve.services.gpu_worker.platforms.cpu import CpuPlatform

        return CpuPlatform(device)
    if device.type == "cuda":
        from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform

        return CudaPlatform(device)
    raise ValueError(f"device type {device.type!r} is not supported (supported: cpu, cuda)")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto": the platform's default (bf16 on CUDA and on CPUs with native bf16, else
    float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return get_platform(device).default_dtype()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]
