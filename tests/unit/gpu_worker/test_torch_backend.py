"""The torch backend against kernels/reference.py, and the metadata builder. Attention runs
both ways the backend can take on a CPU: through the C kernel (short sequences) and through
torch ops alone (no compiler, or the kernel turned off)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_paged_attention
from pagedserve.kernels.reference import (
    paged_decode_attention,
    paged_prefill_attention,
    write_kv_cache,
)
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.selector import get_attention_backend_cls
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend, write_kv

BLOCK_SIZE, NUM_BLOCKS, HQ, HKV, D = 4, 128, 6, 2, 16
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def random_caches(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, BLOCK_SIZE, HKV, D)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def random_tables(seq_lens: list[int], seed: int = 1) -> list[list[int]]:
    perm = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, used = [], 0
    for n in seq_lens:
        count = -(-n // BLOCK_SIZE)
        tables.append(perm[used : used + count])
        used += count
    return tables


@pytest.fixture(params=["kernel", "torch"])
def attention_path(request, monkeypatch):
    """Run the test through the C kernel, or through torch ops alone."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_paged_attention, "supports", lambda query, cache: False)
    else:
        assert cpu_paged_attention.load() is not None, "the C kernel must build in CI"
    return request.param


def test_metadata_slots_and_positions():
    meta = build_attention_metadata([6, 1], [2, 1], [[7, 3], [5]], BLOCK_SIZE, torch.device("cpu"))
    # seq 0's new tokens sit at positions 4 and 5 -> block 3, offsets 0 and 1; seq 1 at 0.
    assert meta.slot_mapping.tolist() == [12, 13, 20]
    assert meta.query_start_loc.tolist() == [0, 2, 3]
    assert meta.block_tables.tolist() == [[7, 3], [5, 0]]
    assert not meta.is_decode_only and meta.max_seq_len == 6 and meta.max_query_len == 2
    assert meta.slot_mapping.dtype == torch.int64 and meta.block_tables.dtype == torch.int32
    assert meta.seq_lens.dtype == meta.query_start_loc.dtype == torch.int32
    assert meta.single_token_seqs.tolist() == [1] and meta.single_token_rows.tolist() == [2]
    empty = build_attention_metadata([], [], [], BLOCK_SIZE, torch.device("cpu"))
    assert empty.block_tables.shape == (0, 1) and empty.slot_mapping.numel() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "seq_lens",
    [[1, 5, 17, 33, 8], [3, 90, 4, 7, 120, 2, 9, 15, 60, 1, 5]],  # the second is length-grouped
    ids=["flat", "grouped"],
)
def test_decode_batch_matches_reference(dtype, seq_lens, attention_path):
    batch = len(seq_lens)
    k_cache, v_cache = random_caches(dtype)
    tables = random_tables(seq_lens)
    meta = build_attention_metadata(seq_lens, [1] * batch, tables, BLOCK_SIZE, torch.device("cpu"))
    assert meta.is_decode_only
    gen = torch.Generator().manual_seed(2)
    q = torch.randn((batch, HQ, D), generator=gen).to(dtype)
    k = torch.randn((batch, HKV, D), generator=gen).to(dtype)
    v = torch.randn((batch, HKV, D), generator=gen).to(dtype)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, ref_k, ref_v, meta.slot_mapping)
    expected = paged_decode_attention(q, ref_k, ref_v, meta.block_tables, meta.seq_lens, 0.25)
    out = TorchAttentionBackend(HQ, HKV, D, 0.25).forward(q, k, v, k_cache, v_cache, meta)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("seq_lens", "query_lens"),
    [
        ([9, 4, 20], [3, 4, 1]),
        # a fresh prompt, a chunk over a cached prefix, a one-token prompt and a long-tailed
        # set of decodes (which take the length-grouped path)
        ([12, 30, 1, 2, 3, 5, 40, 70, 6, 9, 11, 100], [12, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
        # chunks longer than the kernel takes (SDPA) beside short ones and decodes
        ([40, 17, 60, 5, 33], [40, 17, 16, 1, 2]),
    ],
    ids=["small", "long-tailed", "long-chunks"],
)
def test_mixed_batch_matches_reference(dtype, seq_lens, query_lens, attention_path):
    k_cache, v_cache = random_caches(dtype)
    tables = random_tables(seq_lens)
    meta = build_attention_metadata(seq_lens, query_lens, tables, BLOCK_SIZE, torch.device("cpu"))
    assert meta.multi_token_seqs == [i for i, n in enumerate(query_lens) if n > 1]
    gen = torch.Generator().manual_seed(3)
    num_tokens = sum(query_lens)
    q, k, v = (torch.randn((num_tokens, h, D), generator=gen).to(dtype) for h in (HQ, HKV, HKV))
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, ref_k, ref_v, meta.slot_mapping)
    expected = paged_prefill_attention(
        q, ref_k, ref_v, meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.25
    )
    out = TorchAttentionBackend(HQ, HKV, D, 0.25).forward(q, k, v, k_cache, v_cache, meta)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


def test_write_skips_negative_slots():
    k_cache, v_cache = random_caches(torch.float32)
    before = k_cache.clone()
    key = torch.ones((2, HKV, D))
    write_kv(key, key, k_cache, v_cache, torch.tensor([-1, 5]))
    assert torch.equal(k_cache.view(-1, HKV, D)[5], key[1])
    changed = (k_cache != before).any(dim=(2, 3)).nonzero().tolist()
    assert changed == [[1, 1]]  # slot 5 = block 1, offset 1, and nothing else


def test_backend_selection():
    cpu = torch.device("cpu")
    assert get_attention_backend_cls("auto", cpu) is TorchAttentionBackend
    assert get_attention_backend_cls("torch", cpu) is TorchAttentionBackend
    with pytest.raises(ValueError, match="attention backend must be one of"):
        get_attention_backend_cls("flash", cpu)
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        TorchAttentionBackend(5, 2, D, 1.0)
