"""Triton KV-cache write against kernels.reference.write_kv_cache."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.kv_cache_write import write_kv_cache
from pagedserve.kernels.reference import write_kv_cache as reference_write

SENTINEL = -7.0  # exact in every dtype, so untouched slots compare equal bit for bit


def sentinel_caches(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return torch.full(shape, SENTINEL, dtype=dtype), torch.full(shape, SENTINEL, dtype=dtype)


@pytest.mark.parametrize(
    ("num_kv_heads", "head_dim", "block_size", "dtype"),
    [
        (4, 64, 16, torch.float32),
        (2, 128, 32, torch.float16),
        (3, 64, 16, torch.bfloat16),
        (1, 128, 32, torch.float32),
        (2, 80, 16, torch.float16),
    ],
)
def test_write_matches_reference(
    num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(1)
    num_blocks = 6
    num_slots = num_blocks * block_size
    # Random distinct slots across shuffled blocks, a few tokens skipped with -1.
    slot_mapping = torch.randperm(num_slots, generator=gen)[:11]
    slot_mapping[[2, 7]] = -1
    slot_mapping[0] = num_slots - 1  # the very last slot
    key = torch.randn(11, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(11, num_kv_heads, head_dim, generator=gen).to(dtype)
    k_cache, v_cache = sentinel_caches(num_blocks, block_size, num_kv_heads, head_dim, dtype)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
    reference_write(key, value, k_expected, v_expected, slot_mapping)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)
    written = int((slot_mapping >= 0).sum()) * num_kv_heads * head_dim
    assert int((k_cache != SENTINEL).sum()) <= written  # nothing but the slots was touched


def test_strided_fp32_inputs_are_cast_into_an_fp16_cache() -> None:
    gen = torch.Generator().manual_seed(2)
    # key and value as views of a fused [T, Hq + 2 * Hkv, D] projection: strided rows.
    fused = torch.randn(5, 4 + 2 * 2, 64, generator=gen)
    key, value = fused[:, 4:6], fused[:, 6:8]
    slot_mapping = torch.tensor([0, 17, -1, 33, 5], dtype=torch.int64)
    k_cache, v_cache = sentinel_caches(4, 16, 2, 64, torch.float16)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
    reference_write(key, value, k_expected, v_expected, slot_mapping)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)


def test_all_skipped_and_empty_writes_leave_the_cache_alone() -> None:
    k_cache, v_cache = sentinel_caches(2, 16, 2, 64, torch.float32)
    key = torch.randn(3, 2, 64)
    write_kv_cache(key, key, k_cache, v_cache, torch.full((3,), -1, dtype=torch.int64))
    write_kv_cache(key[:0], key[:0], k_cache, v_cache, torch.empty(0, dtype=torch.int64))
    assert bool((k_cache == SENTINEL).all()) and bool((v_cache == SENTINEL).all())


def test_key_shape_mismatch_is_rejected() -> None:
    k_cache, v_cache = sentinel_caches(2, 16, 2, 64, torch.float32)
    key = torch.randn(3, 4, 64)  # 4 heads, the cache holds 2
    with pytest.raises(ValueError, match=r"key must be \[T, Hkv, D\] = \(3, 2, 64\)"):
        write_kv_cache(key, key, k_cache, v_cache, torch.zeros(3, dtype=torch.int64))
