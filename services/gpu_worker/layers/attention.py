"""Self-attention over the paged KV cache, as decoder layers share it: a merged q/k/v
projection, an optional RMSNorm of each query and key head (Qwen3, Gemma 3), the rotary
embedding (none in SmolLM3's NoPE layers), the attention backend (with a learned sink logit
per head where the model has them: GPT-OSS) and the output projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.linear import QKVParallelLinear, RowParallelLinear
from pagedserve.services.gpu_worker.layers.rotary import ApplyRotary, RopeAngles

HeadNorm = Callable[[int], nn.Module]  # head_dim -> a norm over each head's vector


class Attention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        backend_cls: type[BaseAttentionBackend],
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        scale: float | None = None,  # default head_dim ** -0.5
        head_norm: HeadNorm | None = None,
        qk_norm_width: str = "head",
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        sinks: bool = False,
        use_rope: bool = True,
    ) -> None:
        """`head_norm(width)` builds the query and key norms: over each head
        (`qk_norm_width="head"`: Qwen3, Gemma 3) or over the whole projection of this rank
        (`"projection"`: OLMo2, which then refuses tensor parallelism). `use_rope=False`: a
        layer without position embeddings (SmolLM3's NoPE layers), queries and keys as
        projected."""
        super().__init__()
        self.head_dim = head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size, head_dim, num_heads, num_kv_heads, bias=qkv_bias
        )
        self.num_heads = self.qkv_proj.num_heads  # per rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=o_bias)
        self.norm_each_head = qk_norm_width == "head"
        q_width, k_width = (
            (head_dim, head_dim)
            if self.norm_each_head
            else (self.num_heads * head_dim, self.num_kv_heads * head_dim)
        )
        self.q_norm = head_norm(q_width) if head_norm else None
        self.k_norm = head_norm(k_width) if head_norm else None
        self.rotate = ApplyRotary()
        self.use_rope = use_rope
        scale = head_dim**-0.5 if scale is None else scale
        self.sinks = None
        if sinks:  # this rank's heads' logits, as `qkv_proj` holds their queries
            self.sinks = nn.Parameter(torch.empty(self.num_heads))
            self.sinks.weight_loader = self.sinks_loader
        self.attn = backend_cls(
            self.num_heads, self.num_kv_heads, head_dim, scale, sliding_window, logit_softcap,
            sinks=self.sinks,
        )  # fmt: skip

    def sinks_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """This rank's slice of the checkpoint's [num_attention_heads] sink logits."""
        rank, size = self.qkv_proj.tp_rank, self.num_heads
        expected = size * self.qkv_proj.tp_size
        if tuple(loaded.shape) != (expected,):
            raise ValueError(
                f"sinks: checkpoint tensor has shape {tuple(loaded.shape)}, the model "
                f"expects ({expected},)"
            )
        param.data.copy_(loaded.narrow(0, rank * size, size))

    def forward(
        self,
        angles: RopeAngles,  # the tokens' rotary angles
        hidden: torch.Tensor,  # [T, H]
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H]
        num_tokens = hidden.shape[0]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        qk, v = self.qkv_proj(hidden).split([q_size + kv_size, kv_size], dim=-1)
        if self.q_norm is not None and not self.norm_each_head:
            q, k = qk.split([q_size, kv_size], dim=-1)
            qk = torch.cat([self.q_norm(q)[0], self.k_norm(k)[0]], dim=-1)  # [T, Q + KV]
        qk = qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.norm_each_head:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q)[0], self.k_norm(k)[0]], dim=1)  # [T, Hq+Hkv, D]
        if self.use_rope:  # queries and keys in one call (heads are independent)
            qk = self.rotate(qk, angles)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.attn.forward(q, k, v, kv_cache[0], kv_cache[1], metadata)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, q_size))
