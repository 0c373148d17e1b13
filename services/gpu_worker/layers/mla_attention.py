"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over a compressed KV cache.

Each token's keys and values come from one latent c (`kv_lora_rank` features, normed) and
one rotary key k_r (`qk_rope_head_dim`, shared by every head):

    k_h = [W_UK_h c, k_r]      v_h = W_UV_h c       (W_UK_h, W_UV_h: head h's rows of kv_b_proj)

so the cache keeps [c, k_r] per token and layer, not 2 x heads x head_dim. Attention runs in
the absorbed form, W_UK folded into the query:

    score_h = q_nope_h . (W_UK_h c) + q_rope_h . k_r = [q_nope_h W_UK_h, q_rope_h] . [c, k_r]

which is multi-query attention of `num_heads` query heads over one KV "head" of width
`kv_lora_rank + qk_rope_head_dim`, whose values are the same rows (their first
`kv_lora_rank` features are c). The torch backend attends in that geometry (one cache
tensor as both K and V; its C kernel and SDPA on the CPU, SDPA on CUDA) whichever backend
the worker chose: the Triton kernels keep a [heads, width] tile in shared memory, and at
the 576-wide row, compiled ahead of time for sm_90 (bf16), decode needs 297 KB and prefill
656 KB of it (16 heads a KV head; 787 KB at 128), over the 227 KB a block may have. There
is no MLA-specific kernel. W_UV is applied to each head's weighted latent after.
Prefill chunks of `expand_from` tokens or more take the expanded form instead
(`mla_prefill.py`: keys and values of each head rebuilt from the cached latents, fewer
multiply-adds for long chunks); decodes and short chunks stay absorbed.

Queries come from `q_proj`, or through a low-rank `q_a_proj` -> RMSNorm -> `q_b_proj`
(`q_lora_rank`). DeepSeek's rotary dimensions are interleaved pairs (x0, x1), (x2, x3), ...:
they are de-interleaved (evens, then odds) before the usual rotate-half rotation, which gives
every dot product of Hugging Face's interleaved rotation. Under tensor parallelism each rank
holds its heads of q_b_proj (or q_proj), kv_b_proj and o_proj; the down-projections and the
latent cache are whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.layers import mla_prefill
from pagedserve.services.gpu_worker.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import ApplyRotary, RopeAngles
from pagedserve.services.gpu_worker.parallel_state import divide, get_tp_world_size
from pagedserve.shared.kv_cache_spec import KVCacheSpec


@dataclass(frozen=True, slots=True)
class MLAShape:
    """The dimensions of one MLA layer, as the config names them."""

    hidden_size: int
    num_heads: int  # all ranks
    q_lora_rank: int | None  # None: queries from one q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """What one token keeps in the cache: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(latent_dim=self.kv_lora_rank, latent_rope_dim=self.qk_rope_head_dim)


def mla_backend(chosen: type[BaseAttentionBackend]) -> type[BaseAttentionBackend]:
    """The backend MLA attends through: the torch one, unless a test hands in a subclass of
    it (see the module docstring for why the Triton kernels are not used)."""
    return chosen if issubclass(chosen, TorchAttentionBackend) else TorchAttentionBackend


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., D] with pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class MLAAttention(nn.Module):
    def __init__(
        self,
        shape: MLAShape,
        backend_cls: type[BaseAttentionBackend],
        *,
        scale: float,  # the softmax scale (DeepSeek: qk_head_dim^-0.5, times yarn's mscale^2)
        rope_interleaved: bool = True,
        bias: bool = False,  # attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj
        eps: float = 1e-6,
        expand_from: int | None = None,  # chunk length from which prefill expands (tests)
    ) -> None:
        super().__init__()
        self.shape = shape
        self.expand_from = expand_from or mla_prefill.expand_from(
            shape.kv_lora_rank, shape.qk_rope_head_dim, shape.qk_nope_head_dim, shape.v_head_dim
        )
        self.num_heads = divide(shape.num_heads, get_tp_world_size(), "num_attention_heads")
        self.num_kv_heads = 1  # the latent: one row per token whatever the heads
        self.head_dim = shape.latent_width  # the backend's width of keys and values
        self.rope_interleaved = rope_interleaved
        q_width = shape.num_heads * shape.qk_head_dim
        if shape.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(shape.hidden_size, q_width)
        else:
            self.q_a_proj = ReplicatedLinear(shape.hidden_size, shape.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(shape.q_lora_rank, eps)
            self.q_b_proj = ColumnParallelLinear(shape.q_lora_rank, q_width)
        self.kv_a_proj_with_mqa = ReplicatedLinear(shape.hidden_size, shape.latent_width, bias=bias)
        self.kv_a_layernorm = RMSNorm(shape.kv_lora_rank, eps)
        self.kv_b_proj = ColumnParallelLinear(
            shape.kv_lora_rank, shape.num_heads * (shape.qk_nope_head_dim + shape.v_head_dim)
        )
        self.o_proj = RowParallelLinear(shape.num_heads * shape.v_head_dim, shape.hidden_size,
                                        bias=bias)  # fmt: skip
        self.rotate = ApplyRotary()
        self.attn = mla_backend(backend_cls)(self.num_heads, 1, shape.latent_width, scale)

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's W_UK [h, nope, latent] and W_UV [h, v, latent], views of kv_b_proj."""
        s = self.shape
        weight = self.kv_b_proj.weight.view(self.num_heads, -1, s.kv_lora_rank)
        return weight[:, : s.qk_nope_head_dim], weight[:, s.qk_nope_head_dim :]

    def queries(self, hidden: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, h, qk_head_dim]
        if self.shape.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden))[0])
        return q.view(hidden.shape[0], self.num_heads, self.shape.qk_head_dim)

    def latent_rows(
        self, hidden: torch.Tensor, q_rope: torch.Tensor, angles: RopeAngles
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's cache row [T, 1, latent + rope] (normed latent, rotated key) and its
        queries' rotated rope part [T, h, rope]."""
        s, num_tokens = self.shape, hidden.shape[0]
        latent, k_rope = self.kv_a_proj_with_mqa(hidden).split(
            [s.kv_lora_rank, s.qk_rope_head_dim], dim=-1
        )
        latent = self.kv_a_layernorm(latent.contiguous())[0]
        ropes = torch.cat([q_rope, k_rope.view(num_tokens, 1, s.qk_rope_head_dim)], dim=1)
        if self.rope_interleaved:
            ropes = deinterleave(ropes)
        ropes = self.rotate(ropes.contiguous(), angles)  # [T, h + 1, rope], a fresh tensor
        row = torch.cat([latent.unsqueeze(1), ropes[:, self.num_heads :]], dim=-1)
        return row, ropes[:, : self.num_heads]

    def forward(
        self,
        angles: RopeAngles,  # the tokens' rotary angles over qk_rope_head_dim
        hidden: torch.Tensor,  # [T, H]
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # one latent tensor, twice
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        s, num_tokens = self.shape, hidden.shape[0]
        q_nope, q_rope = self.queries(hidden).split([s.qk_nope_head_dim, s.qk_rope_head_dim], -1)
        row, q_rope = self.latent_rows(hidden, q_rope, angles)
        cache = kv_cache[0]
        plan = mla_prefill.plan_step(metadata, cache.shape[1], self.expand_from)
        if plan is None:
            out = self.absorbed(q_nope, q_rope, row, cache, metadata)
        else:
            out = hidden.new_empty(num_tokens, self.num_heads, s.v_head_dim)
            if plan.absorbed is not None:
                rows = plan.absorbed_rows
                out[rows] = self.absorbed(q_nope[rows], q_rope[rows], row[rows], cache,
                                          plan.absorbed)  # fmt: skip
            self.expanded(q_nope, q_rope, row, cache, metadata, plan, out)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * s.v_head_dim))

    def absorbed(
        self,
        q_nope: torch.Tensor,  # [T, h, nope]
        q_rope: torch.Tensor,  # [T, h, rope], rotated
        row: torch.Tensor,  # [T, 1, latent + rope]
        cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, h, v]
        """Write the rows, then attend with W_UK in the queries and W_UV on the output."""
        w_uk, w_uv = self.up_projections()
        # q_nope_h W_UK_h: [h, T, nope] x [h, nope, latent] -> [T, h, latent]
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
        query = torch.cat([q_latent, q_rope], dim=-1)  # [T, h, latent + rope]
        out = self.attn.forward(query, row, row, cache, cache, metadata)
        # each head's weighted latent through W_UV_h: [h, T, latent] x [h, latent, v]
        out = torch.bmm(out[..., : self.shape.kv_lora_rank].transpose(0, 1), w_uv.transpose(1, 2))
        return out.transpose(0, 1)

    def expanded(
        self,
        q_nope: torch.Tensor,  # [T, h, nope], the whole step
        q_rope: torch.Tensor,
        row: torch.Tensor,
        cache: torch.Tensor,
        metadata: AttentionMetadata,
        plan: mla_prefill.StepPlan,
        out: torch.Tensor,  # [T, h, v]: the expanded sequences' rows are written
    ) -> None:
        """Write the long chunks' rows, then attend each with expanded keys and values."""
        s, rows = self.shape, plan.expanded_rows
        mla_prefill.write_rows(cache, row[rows], metadata.slot_mapping[rows])
        query = torch.cat([q_nope, q_rope], dim=-1)  # [T, h, qk_head_dim]
        starts = metadata.query_start_list
        for i in plan.expanded:
            start, end = starts[i], starts[i + 1]
            out[start:end] = mla_prefill.expanded_chunk(
                query[start:end], cache, metadata.block_tables[i : i + 1],
                metadata.seq_lens_list[i], self.kv_b_proj, s.qk_nope_head_dim, s.v_head_dim,
                self.attn.scale,
            )  # fmt: skip
