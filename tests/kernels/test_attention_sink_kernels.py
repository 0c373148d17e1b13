"""Attention sinks (GPT-OSS: a learned logit per query head in the softmax's denominator) in
the Triton decode (single pass and split) and prefill kernels under the interpreter, and in
the CPU backend's eager and fused forms, against the plain-torch reference; with and without
a sliding window, whose slid-out blocks are poisoned (a kernel that read one would produce
NaN)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_decode import paged_decode_attention
from pagedserve.kernels.paged_prefill import paged_prefill_attention
from pagedserve.kernels.reference import paged_decode_attention as reference_decode
from pagedserve.kernels.reference import paged_prefill_attention as reference_prefill
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.windowed import windowed_attention
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like
from tests.kernels.test_sliding_window_kernels import BLOCK_SIZE, tables_without_slid_blocks

F32, F16 = torch.float32, torch.float16
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 64


def sinks_for(dtype: torch.dtype) -> torch.Tensor:
    """Sink logits around the scores' scale, one far above them (that head's output nearly
    vanishes) and one far below (it is nearly plain softmax)."""
    sinks = torch.randn(NUM_HEADS, generator=torch.Generator().manual_seed(7))
    sinks[1], sinks[6] = 12.0, -30.0
    return sinks.to(dtype)


@pytest.mark.parametrize(("window", "dtype"), [(None, F32), (24, F32), (17, F16)])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_with_sinks_matches_the_reference(window, dtype, num_splits) -> None:
    seq_lens = [1, 23, 24, 25, 90, 200]
    case = make_paged_case(seq_lens, [1] * len(seq_lens), NUM_HEADS, NUM_KV_HEADS, HEAD_DIM,
                           BLOCK_SIZE, dtype)  # fmt: skip
    tables = tables_without_slid_blocks(case, [1] * len(seq_lens), window or 10**6)
    sinks = sinks_for(dtype)
    out = paged_decode_attention(
        case.query, case.poisoned_k_cache, case.poisoned_v_cache, tables, case.seq_lens,
        case.scale, num_splits=num_splits, max_seq_len=max(seq_lens), sliding_window=window,
        sinks=sinks, out=poisoned_like(case.query),
    )  # fmt: skip
    expected = reference_decode(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale,
        sliding_window=window, sinks=sinks,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize(("window", "dtype"), [(None, F32), (24, F32), (9, F16)])
def test_prefill_with_sinks_matches_the_reference(window, dtype) -> None:
    seq_lens, query_lens = [120, 70, 1, 45], [40, 70, 1, 1]
    case = make_paged_case(seq_lens, query_lens, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                           dtype)  # fmt: skip
    tables = tables_without_slid_blocks(case, query_lens, window or 10**6)
    sinks = sinks_for(dtype)
    out = paged_prefill_attention(
        case.query, case.poisoned_k_cache, case.poisoned_v_cache, tables,
        case.query_start_loc, case.seq_lens, case.scale, sliding_window=window, sinks=sinks,
        out=poisoned_like(case.query),
    )  # fmt: skip
    expected = reference_prefill(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
        case.seq_lens, case.scale, sliding_window=window, sinks=sinks,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("window", [None, 24])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_the_cpu_paths_with_sinks_match_the_reference(window, fused, with_sinks) -> None:
    """`attention/windowed.py`'s eager form and its fused one (flash attention's log-sum-exp
    rescaled by each head's sink)."""
    seq_lens, query_lens = [120, 70, 1, 45], [40, 70, 1, 1]
    case = make_paged_case(seq_lens, query_lens, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                           F32)  # fmt: skip
    tables = tables_without_slid_blocks(case, query_lens, window or 10**6)
    metadata = build_attention_metadata(
        seq_lens, query_lens, tables.tolist(), BLOCK_SIZE, torch.device("cpu")
    )
    sinks = sinks_for(F32) if with_sinks else None
    out = windowed_attention(
        case.query, case.poisoned_k_cache, case.poisoned_v_cache, metadata, case.scale, window,
        None, sinks, fused=fused,
    )  # fmt: skip
    expected = reference_prefill(
        case.query, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
        case.seq_lens, case.scale, sliding_window=window, sinks=sinks,
    )  # fmt: skip
    torch.testing.assert_close(out, expected, **TOLERANCES[F32])


def test_sinks_change_the_result_as_defined() -> None:
    """A sink at -inf is plain softmax; a finite one scales each output row by the share of
    the denominator the keys keep (else the tests above would prove nothing)."""
    case = make_paged_case([50], [1], NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, F32)
    args = (case.query, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
            case.scale)  # fmt: skip
    plain = reference_decode(*args)
    no_sinks = reference_decode(*args, sinks=torch.full((NUM_HEADS,), -torch.inf))
    torch.testing.assert_close(no_sinks, plain, atol=1e-6, rtol=1e-6)
    sinks = sinks_for(F32)
    with_sinks = reference_decode(*args, sinks=sinks)
    keys = case.k_cache[case.block_tables[0, :4].long()].flatten(0, 1)[:50]  # [L, Hkv, D]
    group = NUM_HEADS // NUM_KV_HEADS
    scores = torch.einsum("hd,lhd->hl", case.query[0], keys.repeat_interleave(group, 1))
    logsumexp = (scores * case.scale).logsumexp(dim=-1)  # [Hq]
    kept = torch.sigmoid(logsumexp - sinks)  # Z / (Z + exp(sink))
    torch.testing.assert_close(with_sinks[0], plain[0] * kept[:, None], atol=1e-5, rtol=1e-5)
