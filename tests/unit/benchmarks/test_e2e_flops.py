"""Useful FLOPs of a workload and the share of the FLOP limit a run reaches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.e2e_flops import (
    best_rate,
    fraction_of_flop_limit,
    layer_weights,
    model_dims,
    request_flops,
    workload_flops,
)
from pagedserve.services.cli.loadgen.workload import BenchRequest

SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "num_hidden_layers": 30, "intermediate_size": 1536,
           "vocab_size": 49152}  # fmt: skip


@pytest.fixture
def dims(tmp_path: Path) -> dict[str, int]:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return model_dims(tmp_path)


def test_layer_weights_and_embedding_make_smollm2s_135m_parameters(dims: dict[str, int]) -> None:
    norms = 30 * 2 * 576 + 576
    total = layer_weights(dims) + dims["vocab"] * dims["hidden"] + norms
    assert 134e6 < total < 135e6  # SmolLM2-135M: 134.5M parameters


def test_one_token_in_one_out(dims: dict[str, int]) -> None:
    # the prompt token goes through the layers (context 1) and the head; the output token,
    # the last, is never fed back
    attention = 4 * 30 * 576 * 1
    expected = 2 * layer_weights(dims) + attention + 2 * 49152 * 576
    assert request_flops(dims, 1, 1) == expected


def test_attention_grows_with_the_square_of_the_length(dims: dict[str, int]) -> None:
    def attention(n: int) -> float:
        linears = 2 * layer_weights(dims) * (n - 1 + 1)
        return request_flops(dims, n, 1) - linears - 2 * 49152 * 576

    assert attention(100) / attention(10) == pytest.approx(5050 / 55)


def test_workload_sums_requests_and_fraction_divides(dims: dict[str, int]) -> None:
    requests = [BenchRequest("a", [1] * 5, 3), BenchRequest("b", [1] * 2, 7)]
    total = workload_flops(dims, requests)
    assert total == request_flops(dims, 5, 3) + request_flops(dims, 2, 7)
    assert fraction_of_flop_limit(100.0, 2.0, 100.0) == 0.5
    with pytest.raises(ValueError, match="positive"):
        fraction_of_flop_limit(1.0, 0.0, 1.0)


def test_the_flop_limit_is_the_fastest_matmul_sample_and_keeps_them_all() -> None:
    samples = [
        {"dtype": "float32", "threads": 2, "flops_per_s": r} for r in (7.6e10, 1.08e11, 9e10)
    ]
    rate = best_rate(samples)
    assert rate["flops_per_s"] == 1.08e11 and rate["threads"] == 2
    assert rate["samples_flops_per_s"] == [7.6e10, 1.08e11, 9e10]
    with pytest.raises(ValueError, match="no matmul rate"):
        best_rate([])


def test_the_fp32_limit_is_the_faster_of_torch_mm_and_the_kernel(monkeypatch) -> None:
    """MKL runs a generic path on AMD CPUs: the kernel's rate is the machine's limit there,
    and a share of the slower rate would flatter every server."""
    import torch

    from benchmarks import roofline

    monkeypatch.setattr(roofline, "matmul_flops_per_s", lambda dtype: 1e11)
    monkeypatch.setattr(roofline, "sgemm_kernel_flops_per_s", lambda: 1.8e11)
    assert roofline.limit_flops_per_s(torch.float32) == 1.8e11
    assert roofline.limit_flops_per_s(torch.bfloat16) == 1e11  # the kernel is float32 only
    monkeypatch.setattr(roofline, "sgemm_kernel_flops_per_s", lambda: None)  # not built
    assert roofline.limit_flops_per_s(torch.float32) == 1e11


def test_the_kernels_rate_is_measured_where_it_builds() -> None:
    from benchmarks import roofline
    from pagedserve.kernels import cpu_small_sgemm

    rate = roofline.sgemm_kernel_flops_per_s(rows=4, size=64, num_iters=1)
    assert (rate is None) == (not cpu_small_sgemm.available())
    assert rate is None or rate > 0
