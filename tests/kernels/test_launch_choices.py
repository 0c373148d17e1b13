"""Launch choices that keep the kernels out of register spills (measured on sm_80/sm_90
builds by tests/kernels/cuda_compile_check.py): fp32 on CUDA gets 32-token tiles, 32-row
prefill programs and 8-warp decode programs; everything else the 64/64/4 defaults."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.launch_checks import decode_num_warps, tile_size
from pagedserve.kernels.paged_prefill import choose_block_q, prefill_work_items

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(
    ("dtype", "device", "tile", "warps"),
    [
        (torch.float32, CUDA, 32, 8),
        (torch.bfloat16, CUDA, 64, 4),
        (torch.float16, CUDA, 64, 4),
        (torch.float32, CPU, 64, 4),  # the interpreter: no registers to spill
    ],
)
def test_fp32_on_cuda_gets_the_small_tiles(
    dtype: torch.dtype, device: torch.device, tile: int, warps: int
) -> None:
    assert tile_size(dtype, device) == tile
    assert decode_num_warps(dtype, device) == warps


def test_fp32_prefill_programs_hold_32_rows() -> None:
    fp32_block_q, _ = choose_block_q(4, tile_size(torch.float32, CUDA))
    bf16_block_q, _ = choose_block_q(4, tile_size(torch.bfloat16, CUDA))
    assert (fp32_block_q, bf16_block_q) == (8, 16)
    # the work list follows the tile: a 40-token chunk is 5 tiles of 8 tokens, or 3 of 16
    lens = torch.tensor([40])
    assert len(prefill_work_items(lens, lens, fp32_block_q)) == 5
    assert len(prefill_work_items(lens, lens, bf16_block_q)) == 3
