"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM2): GQA, RoPE, RMSNorm, SwiGLU.

Tokens of every sequence in a step are packed into one flat batch `[num_tokens, hidden]`;
attention reads and writes the paged KV cache through the backend. Qwen2 differs only by a
bias on q/k/v. The model knows nothing of tensor parallelism: its layers shard themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata, BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagedserve.services.gpu_worker.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import (
    RopeAngles,
    RotaryEmbedding,
    rotate_in_place,
)

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.models.cpu_fused_forward import CpuFusedForward


def _cfg(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, None)
    return default if value is None else value


class LlamaAttention(nn.Module):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__()
        num_heads = config.num_attention_heads
        num_kv_heads = _cfg(config, "num_key_value_heads", num_heads)
        self.head_dim = _cfg(config, "head_dim", config.hidden_size // num_heads)
        bias = bool(_cfg(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, num_heads, num_kv_heads, bias=bias
        )
        self.num_heads = self.qkv_proj.num_heads  # per rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(num_heads * self.head_dim, config.hidden_size)
        self.attn = backend_cls(
            self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5
        )

    def forward(
        self,
        angles: RopeAngles,  # the tokens' rotary angles
        hidden: torch.Tensor,  # [T, H]
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        qk, v = self.qkv_proj(hidden).split([q_size + kv_size, kv_size], dim=-1)
        # Queries and keys rotated in one call (heads are independent), in the fresh projection.
        qk = rotate_in_place(
            qk.view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), angles
        )
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.attn.forward(q, k, v, kv_cache[0], kv_cache[1], metadata)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter])
        self.down_proj = RowParallelLinear(inter, hidden)
        act = _cfg(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__()
        eps = _cfg(config, "rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(config, backend_cls)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(
        self,
        angles: RopeAngles,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(angles, normed, kv_cache, metadata)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


def _rotary_embedding(config: Any, head_dim: int) -> RotaryEmbedding:
    # transformers >= 5 keeps theta and scaling in rope_parameters; older ones split them.
    rope = dict(_cfg(config, "rope_parameters", None) or _cfg(config, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", _cfg(config, "rope_theta", 10000.0))
    return RotaryEmbedding(head_dim, config.max_position_embeddings, theta, rope)


# Checkpoint names that load into one merged parameter: (ours, theirs, shard id).
_STACKED_PARAMS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend_cls) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, _cfg(config, "rms_norm_eps", 1e-6))
        self.rotary = _rotary_embedding(config, self.head_dim)
        self.tie_word_embeddings = bool(_cfg(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # the forward pass as one loop of C calls on a CPU in bf16 (`cpu_fused_forward.py`),
        # set by the loader once the weights are packed; None: the modules
        self.cpu_fused: CpuFusedForward | None = None

    @property
    def num_kv_heads(self) -> int:
        return self.layers[0].self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].self_attn.head_dim

    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] final hidden states
        if self.cpu_fused is not None and self.cpu_fused.takes(token_ids.shape[0]):
            return self.cpu_fused.forward(token_ids, positions, kv_caches, metadata)
        hidden = self.embed_tokens(token_ids)
        residual = None
        angles = self.rotary.angles(positions)  # the same in every layer
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(angles, hidden, residual, kv_cache, metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[B, H] -> [B, vocab] in the model's dtype on rank 0, None elsewhere. The sampler
        widens bf16 logits to float32 where it needs to (a greedy row's argmax does not; the
        widening took ~0.5-4 ms a bf16 step)."""
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load full checkpoint tensors by HF name; returns the names of parameters loaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            shard_id: object = None
            for ours, theirs, shard in _STACKED_PARAMS:
                if f".{theirs}." in name:
                    name, shard_id = name.replace(theirs, ours), shard
                    break
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in the model")
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            elif shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
            loaded.add(name if shard_id is None else f"{name}:{shard_id}")
        return loaded

    def expected_weights(self) -> set[str]:
        """The names `load_weights` must have seen for the model to be complete."""
        expected: set[str] = set()
        for name, _ in self.named_parameters():
            if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                expected.update(f"{name}:{s}" for s in ("q", "k", "v"))
            elif name.endswith("gate_up_proj.weight"):
                expected.update(f"{name}:{s}" for s in (0, 1))
            else:
                expected.add(name)
        return expected
