"""Decode attention reads gathered keys in place through one fused SDPA call: the same
attention as the head-major copy with explicit matmuls, within float rounding, in float32 and
bfloat16, padded rows included."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.reference import gather_kv
from pagedserve.services.gpu_worker.attention.torch_backend import batched_decode_attention


def head_major_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    """The former layout: K and V copied to [B, Hkv, L, D], one matmul over all heads."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    keys = gather_kv(k_cache, block_tables, max_len).transpose(1, 2).contiguous()
    values = gather_kv(v_cache, block_tables, max_len).transpose(1, 2).contiguous()
    q = query.to(keys.dtype).view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() * scale
    padding = torch.arange(max_len)[None, :] >= seq_lens[:, None].long()
    scores.masked_fill_(padding[:, None, None, :], float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1).to(values.dtype), values)
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,num_heads,num_kv_heads", [(5, 9, 3), (12, 4, 4), (1, 8, 2)])
def test_fused_in_place_attention_equals_the_head_major_copy(
    dtype: torch.dtype, batch: int, num_heads: int, num_kv_heads: int
) -> None:
    torch.manual_seed(batch)
    num_blocks, block_size, head_dim = 64, 8, 32
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    seq_lens = torch.randint(1, 40, (batch,), dtype=torch.int32)
    seq_lens[0] = 40  # the longest sets the padded length
    block_tables = torch.randperm(num_blocks)[: batch * 5].view(batch, 5).int()
    query = torch.randn(batch, num_heads, head_dim).to(dtype)
    args = (query, k_cache, v_cache, block_tables, seq_lens, 40, head_dim**-0.5)
    expected = head_major_attention(*args)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        batched_decode_attention(*args), expected, rtol=tolerance, atol=tolerance
    )
