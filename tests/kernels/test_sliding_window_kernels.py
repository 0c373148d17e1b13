"""The Triton decode and prefill kernels with a sliding window and logit soft-capping, under
the interpreter, against the plain-torch reference (`kernels/reference.py`). Blocks wholly
before every query's window are swapped for the poisoned padding block in the kernels'
tables, as the scheduler gives them back: a kernel that read one would produce NaN."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_decode import paged_decode_attention
from pagedserve.kernels.paged_prefill import paged_prefill_attention
from pagedserve.kernels.reference import paged_decode_attention as reference_decode
from pagedserve.kernels.reference import paged_prefill_attention as reference_prefill
from tests.kernels.paged_case import TOLERANCES, PagedCase, make_paged_case, poisoned_like

F32, F16 = torch.float32, torch.float16
BLOCK_SIZE = 16


def tables_without_slid_blocks(case: PagedCase, query_lens: list[int], window: int) -> torch.Tensor:
    """The block tables with every block before each sequence's first window replaced by the
    padding block (never owned: NaN throughout)."""
    tables = case.block_tables.clone()
    pad = int(tables[0, -1])
    for i, (seq_len, num_new) in enumerate(zip(case.seq_lens.tolist(), query_lens, strict=True)):
        first_key = max(0, seq_len - num_new - window + 1)
        tables[i, : first_key // BLOCK_SIZE] = pad
    return tables


@pytest.mark.parametrize(
    ("window", "softcap", "dtype"),
    [(24, None, F32), (40, 5.0, F32), (None, 3.0, F32), (17, 2.0, F16)],
)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_attends_within_the_window(window, softcap, dtype, num_splits) -> None:
    seq_lens = [1, 23, 24, 25, 90, 200]
    case = make_paged_case(seq_lens, [1] * len(seq_lens), 8, 2, 64, BLOCK_SIZE, dtype)
    tables = tables_without_slid_blocks(case, [1] * len(seq_lens), window or 10**6)
    out = paged_decode_attention(
        case.query, case.poisoned_k_cache, case.poisoned_v_cache, tables, case.seq_lens,
        case.scale, num_splits=num_splits, max_seq_len=max(seq_lens), sliding_window=window,
        softcap=softcap, out=poisoned_like(case.query),
    )  # fmt: skip
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
        sliding_window=window, softcap=softcap,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize(
    ("window", "softcap", "dtype"),
    [(24, None, F32), (50, 5.0, F32), (None, 3.0, F32), (9, None, F16)],
)
def test_prefill_attends_within_the_window(window, softcap, dtype) -> None:
    # chunks over cached prefixes, a whole prompt, and a decode, longer than the windows
    seq_lens, query_lens = [120, 70, 1, 45], [40, 70, 1, 1]
    case = make_paged_case(seq_lens, query_lens, 8, 2, 64, BLOCK_SIZE, dtype)
    tables = tables_without_slid_blocks(case, query_lens, window or 10**6)
    out = paged_prefill_attention(
        case.query, case.poisoned_k_cache, case.poisoned_v_cache, tables,
        case.query_start_loc, case.seq_lens, case.scale, sliding_window=window,
        softcap=softcap, out=poisoned_like(case.query),
    )  # fmt: skip
    expected = reference_prefill(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
        case.seq_lens, case.scale, sliding_window=window, softcap=softcap,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def test_the_window_and_the_cap_change_the_result() -> None:
    """The reference's window and cap are not no-ops on these cases (else the tests above
    would prove nothing)."""
    case = make_paged_case([120], [40], 8, 2, 64, BLOCK_SIZE, F32)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale)  # fmt: skip
    full = reference_prefill(*args)
    assert not torch.allclose(full, reference_prefill(*args, sliding_window=24))
    assert not torch.allclose(full, reference_prefill(*args, softcap=0.5))
