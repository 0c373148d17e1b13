"""The `triton` attention backend against the `torch` backend on whole steps: cache writes
then attention, for a mixed prefill/decode step and a decode-only step."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.attention import get_attention_backend_cls
from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 8, 2, 64, 16, 12


def run_step(
    backend_cls: type,
    seq_lens: list[int],
    query_lens: list[int],
    block_tables: list[list[int]],
    dtype: torch.dtype,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(sum(seq_lens))
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    value = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    metadata = build_attention_metadata(
        seq_lens, query_lens, block_tables, BLOCK_SIZE, torch.device("cpu")
    )
    backend = backend_cls(
        NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, window, softcap, sinks=sinks
    )
    return backend.forward(query, key, value, k_cache, v_cache, metadata)


@pytest.mark.parametrize(
    ("dtype", "window", "softcap", "with_sinks"),
    [
        (torch.float32, None, None, False),
        (torch.bfloat16, None, None, False),
        (torch.float32, 12, None, False),  # a sliding window shorter than the contexts
        (torch.float32, 24, 4.0, False),  # and soft-capped scores (Gemma 2)
        (torch.float32, 12, None, True),  # attention sinks (GPT-OSS's sliding layers)
        (torch.float32, None, None, True),  # and its full ones
    ],
)
def test_prefill_then_decode_steps_match_the_torch_backend(
    dtype: torch.dtype, window: int | None, softcap: float | None, with_sinks: bool
) -> None:
    sinks = torch.linspace(-2.0, 3.0, NUM_HEADS) if with_sinks else None
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    caches = {
        cls: (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        for cls in (TorchAttentionBackend, TritonAttentionBackend)
    }
    block_tables = [[7, 2, 9], [4], [11, 0, 5, 3]]
    steps = [
        ([20, 3, 50], [20, 3, 50]),  # prefills from scratch
        ([21, 4, 51], [1, 1, 1]),  # decode-only: the decode kernel
        ([22, 9, 52], [1, 5, 1]),  # mixed: an extend among decodes
    ]
    tolerance = (
        {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1.6e-2, "rtol": 1.6e-2}
    )
    for seq_lens, query_lens in steps:
        outs = {
            cls: run_step(
                cls,
                seq_lens,
                query_lens,
                block_tables,
                dtype,
                *caches[cls],
                window,
                softcap,
                sinks,
            )
            for cls in caches
        }
        torch.testing.assert_close(
            outs[TritonAttentionBackend], outs[TorchAttentionBackend], **tolerance
        )
    for k_triton, k_torch in zip(
        caches[TritonAttentionBackend], caches[TorchAttentionBackend], strict=True
    ):
        assert torch.equal(k_triton, k_torch)


def test_selector_returns_the_triton_backend() -> None:
    assert get_attention_backend_cls("triton", torch.device("cpu")) is TritonAttentionBackend
