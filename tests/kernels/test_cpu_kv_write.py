"""The CPU KV cache write (kernels/cpu_kv_write.c) against torch's index_copy_, and the
attention backend's use of it."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_kv_write
from pagedserve.services.gpu_worker.attention import torch_backend

pytestmark = pytest.mark.skipif(cpu_kv_write.load() is None, reason="no C compiler")


def caches(dtype: torch.dtype, num_blocks: int = 6, block_size: int = 4, heads: int = 3):
    k_cache = torch.randn(num_blocks, block_size, heads, 8).to(dtype)
    return k_cache, torch.randn_like(k_cache)


def qkv_views(num_tokens: int, dtype: torch.dtype, heads: int = 3):
    """Keys and values as the model has them: views into one fused projection's rows."""
    qkv = torch.randn(num_tokens, (5 + 2 * heads) * 8).to(dtype)
    key = qkv[:, 40 : 40 + heads * 8].view(num_tokens, heads, 8)
    value = qkv[:, 40 + heads * 8 :].view(num_tokens, heads, 8)
    return key, value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_writes_each_token_to_its_slot_as_index_copy_does(dtype):
    k_cache, v_cache = caches(dtype)
    key, value = qkv_views(5, dtype)
    slots = torch.tensor([7, 0, 23, 12, 3])
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.view(-1, 3, 8).index_copy_(0, slots, key)
    expected_v.view(-1, 3, 8).index_copy_(0, slots, value)
    assert cpu_kv_write.supports(key, value, k_cache, v_cache, slots)
    cpu_kv_write.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_skips_padded_tokens():
    k_cache, v_cache = caches(torch.bfloat16)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key, value = qkv_views(3, torch.bfloat16)
    cpu_kv_write.write_kv(key, value, k_cache, v_cache, torch.tensor([-1, 9, -1]))
    flat_k, flat_v = k_cache.view(-1, 3, 8), v_cache.view(-1, 3, 8)
    assert torch.equal(flat_k[9], key[1]) and torch.equal(flat_v[9], value[1])
    untouched = [s for s in range(24) if s != 9]
    assert torch.equal(flat_k[untouched], before_k.view(-1, 3, 8)[untouched])
    assert torch.equal(flat_v[untouched], before_v.view(-1, 3, 8)[untouched])


def test_a_slot_past_the_caches_is_refused_and_nothing_is_written():
    k_cache, v_cache = caches(torch.float32)
    before = k_cache.clone()
    key, value = qkv_views(2, torch.float32)
    with pytest.raises(ValueError, match="past the caches' 24"):
        cpu_kv_write.write_kv(key, value, k_cache, v_cache, torch.tensor([1, 24]))
    assert torch.equal(k_cache, before)


def test_what_it_does_not_take():
    k_cache, v_cache = caches(torch.float32)
    key, value = qkv_views(2, torch.float32)
    slots = torch.tensor([1, 2])
    assert not cpu_kv_write.supports(key.bfloat16(), value, k_cache, v_cache, slots)  # dtype
    assert not cpu_kv_write.supports(key, value, k_cache, v_cache, slots.int())  # int32 slots
    heads_apart = key.transpose(0, 1).contiguous().transpose(0, 1)  # heads not contiguous
    assert not cpu_kv_write.supports(heads_apart, value, k_cache, v_cache, slots)
    assert not cpu_kv_write.supports(key, value, k_cache.transpose(0, 1), v_cache, slots)


@pytest.mark.parametrize("kernel", [True, False])
def test_the_backend_writes_the_same_cache_with_and_without_it(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(cpu_kv_write, "supports", lambda *args: False)
    k_cache, v_cache = caches(torch.bfloat16)
    key, value = qkv_views(4, torch.bfloat16)
    slots = torch.tensor([5, -1, 17, 2])
    torch_backend.write_kv(key, value, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 3, 8), v_cache.view(-1, 3, 8)
    for row, slot in ((0, 5), (2, 17), (3, 2)):
        assert torch.equal(flat_k[slot], key[row]) and torch.equal(flat_v[slot], value[row])
