"""The CUDA platform compiles the fused-MoE kernel's variants at load: one step per tile
class for each MoE layer shape (here through the interpreter), so that no decode step
compiles inside a request after the profile's prefill compiled only the widest."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pagedserve.kernels import fused_moe as fused_moe_kernel
from pagedserve.kernels.fused_moe import Tiles, choose_tiles, warm_up_token_counts
from pagedserve.services.gpu_worker.layers.fused_moe import ExpertsOp, FusedMoE
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform


def test_one_step_per_tile_class():
    for dtype in (torch.bfloat16, torch.float32):
        counts = warm_up_token_counts(64, 6, dtype)
        tiles = [choose_tiles(n * 6, 64, dtype) for n in counts]
        assert len(set(tiles)) == len(tiles) == 3, (dtype, tiles)
    assert choose_tiles(warm_up_token_counts(8, 2, torch.bfloat16)[-1] * 2, 8, torch.bfloat16) == (
        Tiles(128, 128, 64, num_warps=8)
    )


def test_prepare_model_runs_each_layer_shape_once_per_tile_class(monkeypatch):
    calls: list[tuple[int, int]] = []
    real = fused_moe_kernel.fused_experts

    def counted(x, w13, *args):
        calls.append((x.shape[0], w13.shape[0]))
        return real(x, w13, *args)

    monkeypatch.setattr(fused_moe_kernel, "fused_experts", counted)
    layers = [FusedMoE(16, 24, 4, Routing(2)) for _ in range(2)]  # one shape, twice
    layers.append(FusedMoE(16, 24, 8, Routing(1)))  # another shape
    for layer in layers:
        layer.compute_experts = ExpertsOp(form="cuda")
        for param in layer.parameters():
            param.data.normal_()
    CudaPlatform(torch.device("cpu")).prepare_model(nn.ModuleList(layers), world_size=1)
    expected = [(n, 4) for n in warm_up_token_counts(4, 2, torch.float32)]
    expected += [(n, 8) for n in warm_up_token_counts(8, 1, torch.float32)]
    assert calls == expected


@pytest.mark.parametrize("num_experts", [4, 64])
def test_a_decode_steps_variant_is_among_them(num_experts):
    counts = warm_up_token_counts(num_experts, 2, torch.bfloat16)
    decode = choose_tiles(1 * 2, num_experts, torch.bfloat16)
    assert decode in {choose_tiles(n * 2, num_experts, torch.bfloat16) for n in counts}
