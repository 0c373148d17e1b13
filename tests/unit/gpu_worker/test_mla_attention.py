"""Multi-head latent attention over the paged latent cache (absorbed form, torch backend)
against plain attention with every head's keys and values expanded from the latent, written
out here from the formulas; and what the latent cache holds."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.services.gpu_worker.attention.base import build_attention_metadata
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.layers.mla_attention import MLAAttention, MLAShape
from pagedserve.services.gpu_worker.layers.rotary import RotaryEmbedding

BLOCK_SIZE = 4
TINY = dict(hidden_size=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=6)  # fmt: skip
# DeepSeek-V2-Lite's attention (576-wide latent rows), narrower hidden
V2_LITE = dict(hidden_size=256, num_heads=16, kv_lora_rank=512, qk_nope_head_dim=128,
               qk_rope_head_dim=64, v_head_dim=128)  # fmt: skip


NEVER = 1 << 30  # an expand_from no chunk reaches: every token absorbed


def make_layer(q_lora_rank: int | None, interleaved: bool, dims: dict = TINY,
               backend: type = TorchAttentionBackend, expand_from: int | None = None,
               ) -> MLAAttention:  # fmt: skip
    shape = MLAShape(q_lora_rank=q_lora_rank, **dims)
    scale = shape.qk_head_dim**-0.5 * 2
    layer = MLAAttention(shape, backend, scale=scale, rope_interleaved=interleaved,
                         expand_from=expand_from)  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for param in layer.parameters():
            std = 0.3 if param.dim() == 1 else param.shape[1] ** -0.5
            param.copy_(torch.randn_like(param) * std + (1.0 if param.dim() == 1 else 0.0))
    return layer


def rotate_pairs(x: torch.Tensor, positions: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, n, D] rotated as Hugging Face's DeepSeek does: pairs (x0, x1), (x2, x3), ...
    as complex numbers (interleaved), else the halves (rotate-half)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=x.device).float() / dim))
    angles = torch.polar(
        torch.ones(len(positions), dim // 2, device=x.device), positions[:, None] * inv_freq
    )
    pairs = x.reshape(*x.shape[:-1], dim // 2, 2) if interleaved else (
        torch.stack(x.chunk(2, dim=-1), dim=-1)
    )  # fmt: skip
    rotated = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * angles[:, None])
    return rotated.flatten(-2) if interleaved else torch.cat(rotated.unbind(-1), dim=-1)


def expanded_reference(layer: MLAAttention, hidden: torch.Tensor, interleaved: bool):
    """Causal attention of one whole sequence with per-head keys and values."""
    s, n = layer.shape, hidden.shape[0]
    positions = torch.arange(n, device=hidden.device)
    q = layer.queries(hidden)  # [T, h, nope + rope]
    q_nope, q_rope = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], -1)
    latent, k_rope = layer.kv_a_proj_with_mqa(hidden).split(
        [s.kv_lora_rank, s.qk_rope_head_dim], -1
    )
    latent = layer.kv_a_layernorm(latent.contiguous())[0]
    kv = (latent @ layer.kv_b_proj.weight.T).view(n, s.num_heads, -1)
    k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], -1)
    q_rope = rotate_pairs(q_rope, positions, interleaved)
    k_rope = rotate_pairs(k_rope.view(n, 1, -1), positions, interleaved).expand(-1, s.num_heads, -1)
    scores = torch.einsum("qhd,khd->hqk", torch.cat([q_nope, q_rope], -1),
                          torch.cat([k_nope, k_rope], -1)) * layer.attn.scale  # fmt: skip
    causal = torch.ones(n, n, dtype=torch.bool, device=hidden.device).tril()
    scores = scores.masked_fill(~causal, -math.inf)
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
    return layer.o_proj(out)


def check_against_expanded(
    layer: MLAAttention, device: str, block_size: int = 4, **tolerance: float
) -> None:
    """Two sequences, each served in pieces over its cached prefix: a 20/17-token prefill,
    then an 18-token chunk beside the other's decode, then decodes; every row as the
    reference. Their blocks interleave in the cache."""
    dev = torch.device(device)
    layer = layer.to(dev)
    s = layer.shape
    rotary = RotaryEmbedding(s.qk_rope_head_dim, 64, 10000.0).to(dev)
    spec = s.kv_cache_spec()
    layout = KVCacheLayout.from_specs([spec], block_size, 4, 8, torch.float32)
    cache = layout.allocate(32, dev)[0]
    assert cache[0] is cache[1] and cache[0].shape == (32, block_size, 1, s.latent_width)
    torch.manual_seed(1)
    hidden = {"a": torch.randn(40, s.hidden_size, device=dev),
              "b": torch.randn(20, s.hidden_size, device=dev)}  # fmt: skip
    tables = {"a": list(range(1, 32, 2)), "b": list(range(2, 32, 2))}
    # (sequence, tokens done before, tokens this step) per step
    steps = [[("a", 0, 20), ("b", 0, 17)], [("a", 20, 18), ("b", 17, 1)],
             [("a", 38, 1), ("b", 18, 1)], [("a", 39, 1), ("b", 19, 1)]]  # fmt: skip
    got = {"a": [], "b": []}
    with torch.no_grad():
        for step in steps:
            rows = torch.cat([hidden[name][done : done + new] for name, done, new in step])
            positions = torch.cat([torch.arange(done, done + new) for _, done, new in step])
            metadata = build_attention_metadata(
                [done + new for _, done, new in step], [new for _, _, new in step],
                [tables[name][: -(-(done + new) // block_size)] for name, done, new in step],
                block_size, dev,
            )  # fmt: skip
            out = layer(rotary.angles(positions.to(dev)), rows, cache, metadata)
            for (name, *_), piece in zip(step, out.split([n for *_, n in step]), strict=True):
                got[name].append(piece)
        for name in ("a", "b"):
            expected = expanded_reference(layer, hidden[name], layer.rope_interleaved)
            torch.testing.assert_close(torch.cat(got[name]), expected, **tolerance)


@pytest.mark.parametrize("expand_from", [NEVER, None, 2], ids=["absorbed", "auto", "expanded"])
@pytest.mark.parametrize(("q_lora_rank", "interleaved"), [(None, True), (12, False)])
def test_latent_attention_equals_expanded_attention(q_lora_rank, interleaved, expand_from):
    """Every token absorbed; the chunks of 18 tokens or more expanded (twice TINY's
    break-even: a step mixing an expanded and an absorbed chunk, one mixing an expanded chunk
    with a decode, decode-only steps); every chunk expanded."""
    layer = make_layer(q_lora_rank, interleaved, expand_from=expand_from)
    assert expand_from is not None or layer.expand_from == 18
    check_against_expanded(layer, "cpu", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("expand_from", [None, 2], ids=["absorbed", "expanded"])
def test_latent_attention_at_v2_lite_width_equals_expanded_attention(expand_from) -> None:
    """576-wide latent rows through the torch backend (the C kernel's and SDPA's paths), its
    chunks below the 316 tokens it expands from; and expanded."""
    layer = make_layer(None, True, V2_LITE, expand_from=expand_from)
    assert expand_from is not None or layer.expand_from == 316
    check_against_expanded(layer, "cpu", rtol=2e-4, atol=2e-4)


def test_latent_attention_takes_the_torch_backend_whatever_was_chosen() -> None:
    """The Triton kernels' tiles of a 576-wide row overflow a GPU block's shared memory
    (see layers/mla_attention.py), so MLA never hands its rows to them."""
    from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend

    layer = make_layer(None, True, backend=TritonAttentionBackend)
    assert type(layer.attn) is TorchAttentionBackend


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dims", [TINY, V2_LITE], ids=["tiny", "v2-lite"])
def test_latent_attention_on_cuda(dims) -> None:
    """The torch backend's CUDA paths (SDPA over the gathered rows, index_copy writes) in
    MLA's geometry, 16-token blocks, fp32, against the expanded reference on the GPU."""
    layer = make_layer(24, True, dims)
    check_against_expanded(layer, "cuda", block_size=16, rtol=1e-3, atol=1e-3)
