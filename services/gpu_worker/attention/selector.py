"""Backend choice by name: "torch", "triton", or "auto" (triton on CUDA, else torch)."""

from __future__ import annotations

import importlib

import torch

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend

BACKEND_NAMES = ("auto", "torch", "triton")


def get_attention_backend_cls(name: str, device: torch.device) -> type[BaseAttentionBackend]:
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention backend must be one of {BACKEND_NAMES}, got {name!r}")
    if name == "auto":
        from pagedserve.services.gpu_worker.platforms import get_platform

        name = get_platform(device).default_attention_backend
    if name == "torch":
        from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend
    try:
        module = importlib.import_module("pagedserve.services.gpu_worker.attention.triton_backend")
    except ImportError as exc:
        raise ValueError(f"the triton attention backend is unavailable: {exc}") from exc
    return module.TritonAttentionBackend
