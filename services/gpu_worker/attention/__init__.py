"""Attention backends: one contract (`base.py`), a plain-torch and a Triton implementation."""

from __future__ import annotations

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.attention.selector import get_attention_backend_cls

__all__ = ["AttentionMetadata", "BaseAttentionBackend", "get_attention_backend_cls"]
