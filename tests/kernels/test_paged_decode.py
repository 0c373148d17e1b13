"""Triton paged decode attention against kernels.reference, under the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import paged_decode
from pagedserve.kernels.paged_decode import choose_num_splits, paged_decode_attention
from pagedserve.kernels.reference import paged_decode_attention as reference_decode
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# A covering set rather than the full cross product: every (Hq, Hkv) pair, head size,
# block size and dtype appears, and each is seen with the single pass and with forced
# split-K. Context lengths per case: 1, exactly one block, odd lengths across tile bounds.
CASES = [
    # (num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits)
    (4, 4, 64, 16, F32, 1),
    (4, 4, 128, 32, F16, 3),
    (8, 2, 64, 32, BF16, 1),
    (8, 2, 128, 16, F32, 2),
    (9, 3, 64, 16, F16, 1),
    (9, 3, 128, 32, BF16, 4),
    (5, 1, 128, 16, F16, 1),
    (5, 1, 64, 32, F32, 3),
    (8, 2, 64, 16, F16, None),
    (6, 2, 80, 16, BF16, 2),  # head_dim not a power of two: padded lanes masked
]


def seq_lens_for(block_size: int) -> list[int]:
    return [1, block_size, 2 * block_size + 3, 137]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "num_splits"), CASES
)
def test_decode_matches_reference(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_splits: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seq_lens = seq_lens_for(block_size)
    case = make_paged_case(
        seq_lens, [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    # Poison the split-K scratch too: every partial and lse element must be written.
    real_split_buffers = paged_decode.split_buffers

    def poisoned_split_buffers(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        partial, lse = real_split_buffers(*args)
        return partial.fill_(float("nan")), lse.fill_(float("nan"))

    monkeypatch.setattr(paged_decode, "split_buffers", poisoned_split_buffers)
    out = paged_decode_attention(
        case.query,
        case.poisoned_k_cache,
        case.poisoned_v_cache,
        case.block_tables,
        case.seq_lens,
        case.scale,
        num_splits=num_splits,
        out=poisoned_like(case.query),
    )
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def test_split_count_beyond_the_context_leaves_empty_splits_harmless() -> None:
    # 8 splits of a 1-token and a 20-token context: most splits see no keys at all.
    case = make_paged_case([1, 20], [1, 1], 4, 2, 64, 16, F32)
    args = (case.query, case.poisoned_k_cache, case.poisoned_v_cache, case.block_tables)
    out = paged_decode_attention(*args, case.seq_lens, case.scale, num_splits=8)
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    torch.testing.assert_close(out, expected, **TOLERANCES[F32])


def test_non_contiguous_query_is_read_through_its_strides() -> None:
    case = make_paged_case([5, 40], [1, 1], 4, 2, 64, 16, F32)
    # A query that is a slice of a wider fused projection, as a model's qkv split gives.
    fused = torch.randn(2, 4 + 2 * 2, 64)
    fused[:, :4] = case.query
    query = fused[:, :4]
    assert not query.is_contiguous()
    out = paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    torch.testing.assert_close(out, expected, **TOLERANCES[F32])


def test_empty_batch_returns_empty_output() -> None:
    case = make_paged_case([3], [1], 4, 2, 64, 16, F32)
    out = paged_decode_attention(
        case.query[:0], case.k_cache, case.v_cache, case.block_tables[:0], case.seq_lens[:0], 1.0
    )
    assert out.shape == (0, 4, 64)


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "max_seq_len", "num_sms", "expected"),
    [
        (64, 8, 2048, 132, 1),  # 512 programs already fill 132 SMs
        (1, 8, 32768, 132, 32),  # long context, tiny batch: capped at MAX_SPLITS
        (2, 8, 2048, 132, 8),  # 32 tiles / 4 per split
        (4, 8, 100, 132, 1),  # too short to be worth splitting
        (3, 1, 1, 1, 1),  # one SM: already full
    ],
)
def test_split_heuristic(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, expected: int
) -> None:
    assert choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms) == expected
