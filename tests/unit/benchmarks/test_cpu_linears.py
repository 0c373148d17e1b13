"""benchmarks/cpu_linears.py: a step's linear shapes from a config, and a timed table over
every product path of a dtype."""

from __future__ import annotations

import json

import torch

from benchmarks import cpu_linears
from pagedserve.kernels import cpu_small_gemm, cpu_small_sgemm


def test_shapes_follow_the_config(tmp_path):
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 96, "num_hidden_layers": 3, "vocab_size": 500}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = cpu_linears.layer_shapes(tmp_path)
    assert shapes[:4] == [(64 + 2 * 32, 64), (64, 64), (192, 64), (64, 96)]
    assert len(shapes) == 3 * 4 + 1 and shapes[-1] == (500, 64)


def test_every_path_is_timed_and_gives_the_product():
    weight = torch.randn(40, 32).bfloat16()
    x = torch.randn(3, 32).bfloat16()
    paths = cpu_linears.products(weight)
    assert "F.linear" in paths
    assert ("oneDNN packed" in paths) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert ("ours" in paths) == (cpu_small_gemm.load() is not None)
    expected = x.double() @ weight.double().T
    for name, product in paths.items():
        assert torch.allclose(product(x).double(), expected, rtol=2e-2, atol=2e-2), name
    table = cpu_linears.measure([(40, 32), (24, 40)], torch.float32, [1, 2], repeats=1)
    kernel = {"ours"} if cpu_small_sgemm.available() else set()
    onednn = {"oneDNN packed"} if torch.backends.mkldnn.is_available() else set()
    assert set(table) == {"F.linear", "MKL packed"} | onednn | kernel
    weight32, x32 = weight.float(), x.float()
    for name, product in cpu_linears.products(weight32).items():
        assert torch.allclose(product(x32), x32 @ weight32.T, rtol=1e-4, atol=1e-4), name
    assert all(t[r] > 0 for t in table.values() for r in (1, 2))
