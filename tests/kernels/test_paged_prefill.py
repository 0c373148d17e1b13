"""Triton paged prefill/extend attention against kernels.reference, under the interpreter."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_prefill import choose_block_q, paged_prefill_attention
from pagedserve.kernels.reference import paged_prefill_attention as reference_prefill
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def batch_for(kind: str, block_size: int) -> tuple[list[int], list[int]]:
    """(seq_lens, query_lens) of a batch: prefills from scratch, extends over a cached
    prefix, decodes (one new token) or a mix, with lengths 1, a block, and odd ones."""
    bs = block_size
    if kind == "prefill":
        return [1, bs, 2 * bs + 5], [1, bs, 2 * bs + 5]
    if kind == "extend":
        return [bs + 3, 3 * bs - 1], [5, 2 * bs + 1]
    if kind == "decode":
        return [1, bs, 2 * bs + 7], [1, 1, 1]
    # mixed: a fresh prefill, decodes, an extend whose chunk crosses block bounds
    return [bs, 2 * bs + 7, 1, 2 * bs + 9, 41], [bs, 1, 1, bs + 2, 1]


# A covering set: every (Hq, Hkv) pair, head size, block size, dtype and batch kind.
CASES = [
    # (num_heads, num_kv_heads, head_dim, block_size, dtype, kind)
    (4, 4, 64, 16, F32, "prefill"),
    (4, 4, 128, 32, BF16, "mixed"),
    (8, 2, 64, 32, F16, "extend"),
    (8, 2, 128, 16, F32, "mixed"),
    (9, 3, 64, 16, BF16, "decode"),
    (9, 3, 128, 32, F16, "prefill"),
    (5, 1, 64, 32, F32, "mixed"),
    (5, 1, 128, 16, F16, "extend"),
    (8, 2, 64, 16, BF16, "prefill"),
    (6, 2, 80, 32, F16, "mixed"),  # head_dim not a power of two: padded lanes masked
]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "kind"), CASES
)
def test_prefill_matches_reference(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    kind: str,
) -> None:
    seq_lens, query_lens = batch_for(kind, block_size)
    case = make_paged_case(
        seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    out = paged_prefill_attention(
        case.query,
        case.poisoned_k_cache,
        case.poisoned_v_cache,
        case.block_tables,
        case.query_start_loc,
        case.seq_lens,
        case.scale,
        out=poisoned_like(case.query),
    )
    expected = reference_prefill(
        case.query,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.query_start_loc,
        case.seq_lens,
        case.scale,
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def test_sequence_without_new_tokens_is_skipped() -> None:
    # The middle sequence has no new tokens this step; its neighbours must be unaffected.
    case = make_paged_case([20, 9, 33], [4, 0, 33], 8, 2, 64, 16, F32)
    args = (case.query, case.poisoned_k_cache, case.poisoned_v_cache, case.block_tables)
    out = paged_prefill_attention(*args, case.query_start_loc, case.seq_lens, case.scale)
    expected = reference_prefill(
        case.query,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.query_start_loc,
        case.seq_lens,
        case.scale,
    )
    torch.testing.assert_close(out, expected, **TOLERANCES[F32])


def test_max_query_len_hint_matches_the_computed_grid() -> None:
    case = make_paged_case([40, 70], [40, 3], 4, 4, 64, 32, F16)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc)
    hinted = paged_prefill_attention(*args, case.seq_lens, case.scale, max_query_len=40)
    computed = paged_prefill_attention(*args, case.seq_lens, case.scale)
    torch.testing.assert_close(hinted, computed, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("group", "expected"),
    [(1, (64, 1)), (3, (16, 4)), (4, (16, 4)), (64, (1, 64)), (128, (1, 128))],
)
def test_block_q_fills_the_rows_of_a_program(group: int, expected: tuple[int, int]) -> None:
    block_q, group_pad = choose_block_q(group)
    assert (block_q, group_pad) == expected
    assert group_pad >= group and block_q * group_pad >= 16
