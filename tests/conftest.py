"""Test-wide set-up. TRITON_INTERPRET must be set before any @triton.jit decorator runs, so
that the Triton kernels run on the CPU under the interpreter when no GPU is present."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The checkout goes last on sys.path, for `benchmarks` and `tests`: our own code is imported as
# `pagedserve.*` (installed), and a folder of the checkout such as kernels/ must never stand in
# front of an installed distribution of the same name (Hugging Face's `kernels`).
CHECKOUT = str(Path(__file__).resolve().parent.parent)
if CHECKOUT not in sys.path:
    sys.path.append(CHECKOUT)

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# Tiny random models (tests/fixtures/tiny_models.py), built once per session.


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.tiny_models import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", tie_word_embeddings=True
    )
