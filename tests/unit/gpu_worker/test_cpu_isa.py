"""`dtype="auto"` on CPU: bf16 only where matmuls are native bf16, so that a machine run
as an AVX2-only one (ISA caps set) gets float32, as such a machine would."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.platforms import cpu as cpu_platform
from pagedserve.services.gpu_worker.platforms import resolve_dtype
from pagedserve.services.gpu_worker.platforms.cpu import cpu_supports_bf16


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU whose flags say AVX512-BF16, torch dispatching to AVX-512."""
    monkeypatch.setattr(cpu_platform.Path, "read_text", lambda self: "flags : avx2 avx512_bf16")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


def test_native_bf16_cpu_gets_bf16(bf16_cpu: None) -> None:
    assert cpu_supports_bf16()
    assert resolve_dtype("auto", torch.device("cpu")) is torch.bfloat16


@pytest.mark.parametrize("isa", ["AVX2", "avx2", "AVX512_CORE"])
def test_onednn_capped_below_bf16_gets_float32(
    bf16_cpu: None, monkeypatch: pytest.MonkeyPatch, isa: str
) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert not cpu_supports_bf16()
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32


def test_onednn_cap_at_bf16_keeps_bf16(bf16_cpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu_supports_bf16()


def test_torch_kernels_capped_to_avx2_gets_float32(
    bf16_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not cpu_supports_bf16()


def test_cpu_without_bf16_flags_gets_float32(
    bf16_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_platform.Path, "read_text", lambda self: "flags : avx2 fma")
    assert not cpu_supports_bf16()
