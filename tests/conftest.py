"""Test-wide set-up. TRITON_INTERPRET must be set before any @triton.jit decorator runs, so
that the Triton kernels run on the CPU under the interpreter when no GPU is present."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
