"""The prefill kernel's flat grid: one program per (query tile that exists, KV head), so a
mixed step launches programs in proportion to its work, with results that still match a
float64 oracle; the padded grid it replaced stays selectable for comparison."""

from __future__ import annotations

import math

import pytest
import torch

import pagedserve.kernels.paged_prefill as paged_prefill
from pagedserve.kernels.paged_prefill import (
    build_work_items,
    choose_block_q,
    paged_prefill_attention,
    prefill_grid,
    prefill_work_items,
)
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.triton_backend import (
    WORK_ITEMS_KEY,
    TritonAttentionBackend,
)
from tests.kernels.launch_recorder import LaunchRecorder
from tests.kernels.oracle import dense_causal_attention_f64
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like


def test_work_items_list_existing_tiles_heaviest_first() -> None:
    # block_q 16: seq 0 has 3 tiles after a 7-token prefix, seq 1 one decode over 100 keys,
    # seq 2 nothing this step, seq 3 one full tile from scratch.
    items = prefill_work_items(torch.tensor([33, 1, 0, 16]), torch.tensor([40, 100, 5, 16]), 16)
    assert items.dtype == torch.int32
    # keys read: (1,0) 100, (0,2) 40, (0,1) 39, (0,0) 23, (3,0) 16
    assert items.tolist() == [[1, 0], [0, 2], [0, 1], [0, 0], [3, 0]]


def test_issue_example_launches_the_tiles_not_the_padded_grid() -> None:
    # Llama-3-8B (32 query heads, 8 KV heads): one 1,792-token chunk beside 256 decodes.
    query_lens, seq_lens = [1792] + [1] * 256, [1792] + [1000] * 256
    items = build_work_items(query_lens, seq_lens, 32, 8, torch.bfloat16, torch.device("cpu"))
    block_q, _ = choose_block_q(4)
    flat = math.prod(prefill_grid("flat", items, 257, 1792, 8, block_q))
    padded = math.prod(prefill_grid("padded", None, 257, 1792, 8, block_q))
    assert flat == 8 * (1792 // block_q + 256) == 2944
    assert padded == 257 * (1792 // block_q) * 8 == 230_272


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_step_programs_follow_the_tiles_and_match_the_f64_oracle(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    # One 40-token chunk over a 10-token prefix beside six decodes; group 4 -> block_q 16.
    query_lens = [40, 1, 1, 1, 1, 1, 1]
    seq_lens = [50, 3, 17, 33, 64, 9, 70]
    case = make_paged_case(seq_lens, query_lens, 8, 2, 64, 16, dtype)
    recorder = LaunchRecorder(paged_prefill.paged_prefill_kernel)
    monkeypatch.setattr(paged_prefill, "paged_prefill_kernel", recorder)
    expected = dense_causal_attention_f64(
        case.query,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        query_lens,
        seq_lens,
        case.scale,
    )
    args = (case.query, case.poisoned_k_cache, case.poisoned_v_cache, case.block_tables)
    locs = (case.query_start_loc, case.seq_lens, case.scale)
    for grid in ("flat", "padded"):
        out = paged_prefill_attention(*args, *locs, grid=grid, out=poisoned_like(case.query))
        torch.testing.assert_close(out.double(), expected, **TOLERANCES[dtype])
    assert recorder.values_of("FLAT_GRID") == [True, False]
    flat_programs, padded_programs = (math.prod(g) for g in recorder.grids)
    assert flat_programs == 2 * (math.ceil(40 / 16) + 6) == 18
    assert padded_programs == 2 * 7 * math.ceil(40 / 16) == 42


def test_backend_builds_the_work_list_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedserve.services.gpu_worker.attention.triton_backend as triton_backend

    calls: list[list[int]] = []

    def counting_build(query_lens: list[int], *rest: object) -> torch.Tensor:
        calls.append(query_lens)
        return build_work_items(query_lens, *rest)

    monkeypatch.setattr(triton_backend, "build_work_items", counting_build)
    backend = TritonAttentionBackend(4, 2, 64, 0.125)
    metadata = build_attention_metadata([20, 5], [20, 1], [[0, 1], [2]], 16, torch.device("cpu"))
    cache = torch.zeros(3, 16, 2, 64)
    for _ in range(2):  # two layers of one step
        query, kv = torch.randn(21, 4, 64), torch.randn(21, 2, 64)
        backend.forward(query, kv, kv, cache, cache.clone(), metadata)
    assert calls == [[20, 1]]
    # group 2 -> block_q 32: one tile per sequence, the 20-key one first
    assert metadata.backend_scratch[WORK_ITEMS_KEY].tolist() == [[0, 0], [1, 0]]


def test_bad_grid_and_work_items_are_refused() -> None:
    case = make_paged_case([20], [4], 4, 2, 64, 16, torch.float32)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc)
    with pytest.raises(ValueError, match="grid must be one of"):
        paged_prefill_attention(*args, case.seq_lens, case.scale, grid="sparse")
    with pytest.raises(ValueError, match=r"work_items must be \[W, 2\] int32"):
        bad = torch.zeros(1, 2, dtype=torch.int64)
        paged_prefill_attention(*args, case.seq_lens, case.scale, work_items=bad)
