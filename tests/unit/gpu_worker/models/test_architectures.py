"""Every supported architecture against transformers (see `arch_check.py`)."""

from __future__ import annotations

from tests.unit.gpu_worker.models.arch_check import check_architecture


def test_llama_with_attention_and_mlp_biases(tmp_path):
    check_architecture(tmp_path, "llama_biases")


def test_qwen3(tmp_path):
    check_architecture(tmp_path, "qwen3")


def test_gemma(tmp_path):
    check_architecture(tmp_path, "gemma")


def test_olmo2(tmp_path):
    check_architecture(tmp_path, "olmo2")


def test_granite(tmp_path):
    check_architecture(tmp_path, "granite")
