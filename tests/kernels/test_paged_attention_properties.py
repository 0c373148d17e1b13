"""Randomised batches (hypothesis) for both attention kernels against the reference: any mix
of chunk lengths, cached prefixes, group sizes and split counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.kernels.paged_decode import paged_decode_attention
from pagedserve.kernels.paged_prefill import paged_prefill_attention
from pagedserve.kernels.reference import paged_decode_attention as reference_decode
from pagedserve.kernels.reference import paged_prefill_attention as reference_prefill
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like

# Few examples: each one runs the kernels under the interpreter.
KERNEL_SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
sequences = st.lists(
    st.tuples(st.integers(0, 70), st.integers(1, 40)),  # (cached prefix, new tokens)
    min_size=1,
    max_size=4,
)


@pytest.mark.slow
@KERNEL_SETTINGS
@given(
    seqs=sequences,
    num_kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    block_size=st.sampled_from([16, 32]),
    seed=st.integers(0, 2**16),
)
def test_prefill_on_random_batches(
    seqs: list[tuple[int, int]], num_kv_heads: int, group: int, block_size: int, seed: int
) -> None:
    seq_lens = [prefix + new for prefix, new in seqs]
    query_lens = [new for _, new in seqs]
    case = make_paged_case(
        seq_lens,
        query_lens,
        num_kv_heads * group,
        num_kv_heads,
        64,
        block_size,
        torch.float32,
        seed,
    )
    locs = (case.query_start_loc, case.seq_lens, case.scale)
    out = paged_prefill_attention(
        case.query,
        case.poisoned_k_cache,
        case.poisoned_v_cache,
        case.block_tables,
        *locs,
        out=poisoned_like(case.query),
    )
    expected = reference_prefill(case.query, case.k_cache, case.v_cache, case.block_tables, *locs)
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float32])


@pytest.mark.slow
@KERNEL_SETTINGS
@given(
    seq_lens=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 5]),
    num_splits=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_decode_on_random_batches(
    seq_lens: list[int], group: int, num_splits: int, seed: int
) -> None:
    case = make_paged_case(seq_lens, [1] * len(seq_lens), 2 * group, 2, 64, 16, torch.float16, seed)
    out = paged_decode_attention(
        case.query,
        case.poisoned_k_cache,
        case.poisoned_v_cache,
        case.block_tables,
        case.seq_lens,
        case.scale,
        num_splits=num_splits,
    )
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float16])
