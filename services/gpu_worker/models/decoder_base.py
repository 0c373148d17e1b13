"""What decoder-only models with Hugging Face module names share: the embedding, the LM head
(tied or not), a stack of layers each holding `self_attn`, and loading checkpoint tensors by
name into merged parameters (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.base import AttentionMetadata
from pagedserve.services.gpu_worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pagedserve.services.gpu_worker.layers.rotary import RopeAngles
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.shared.kv_cache_spec import KVCacheSpec

# Checkpoint names that load into one merged parameter: (ours, theirs, shard id).
STACKED_PARAMS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)
_SHARDS = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": (0, 1)}


def config_value(config: Any, name: str, default: Any) -> Any:
    """`config.name`, or `default` where the config lacks it or holds None."""
    value = getattr(config, name, None)
    return default if value is None else value


def attention_geometry(config: Any) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) of a config, with the usual defaults."""
    num_heads = config.num_attention_heads
    num_kv_heads = config_value(config, "num_key_value_heads", num_heads)
    head_dim = config_value(config, "head_dim", config.hidden_size // num_heads)
    return num_heads, num_kv_heads, head_dim


def layer_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window (None: full attention), as Hugging Face reads the config:
    `layer_types` where it has them, else `use_sliding_window` (Mistral and Phi-3 state no
    such flag: a window they state is used)."""
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            refuse(config, f"layer type(s) {unknown}", "full_attention, sliding_attention")
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    implied = config.model_type in ("mistral", "phi3")
    uses_window = config_value(config, "use_sliding_window", implied)
    return [window if window and uses_window else None] * num_layers


def refuse(config: Any, feature: str, supported: str) -> None:
    """An error naming a config feature this implementation does not have."""
    arch = (getattr(config, "architectures", None) or [config.model_type])[0]
    raise ValueError(f"{arch}: {feature} is not supported ({supported})")


class DecoderLM(BaseCausalLM):
    """Subclasses build `self.layers` (each with `self_attn`, called as
    `layer(angles, hidden, residual, kv_cache, metadata)`), `self.norm` and `self.rotary`;
    `embed_scale` multiplies the embeddings (Gemma, Granite)."""

    embed_scale: float | None = None
    # Gemma rounds the scale to the model's dtype before multiplying; Granite does not
    embed_scale_in_dtype: bool = True

    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = STACKED_PARAMS

    def __init__(self, config: Any, backend_cls: Any) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.windows = layer_windows(config)  # per layer; None: full attention
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(config_value(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def num_kv_heads(self) -> int:
        return self.layers[0].self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].self_attn.head_dim

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [KVCacheSpec(window) for window in self.windows]

    @property
    def takes_logit_rows(self) -> bool:
        """Its last layer can go on past attention with only some rows (`select_rows`)."""
        return getattr(self.layers[-1], "selects_rows", False)

    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
        logit_rows: torch.Tensor | None = None,  # [R]
    ) -> torch.Tensor:  # [T, H] final hidden states
        """Given `logit_rows` (where `takes_logit_rows`), the other rows stop in the last
        layer after its attention (o product included) and come back zero; every row's keys
        and values are still cached."""
        hidden = self.embed(token_ids)
        residual = None
        keep = (
            torch.unique(logit_rows) if logit_rows is not None and self.takes_logit_rows else None
        )
        last = len(self.layers) - 1
        for index, (layer, angles, kv_cache) in enumerate(
            zip(self.layers, self.layer_angles(positions), kv_caches, strict=True)
        ):
            rows = {"keep": keep} if index == last and keep is not None else {}
            hidden, residual = layer(angles, hidden, residual, kv_cache, metadata, **rows)
        hidden, _ = self.norm(hidden, residual)
        if keep is None:
            return hidden
        return hidden.new_zeros(token_ids.shape[0], hidden.shape[1]).index_copy_(0, keep, hidden)

    def layer_angles(self, positions: torch.Tensor) -> list[RopeAngles]:
        """Each layer's rotary angles at `positions`: one set for all (Gemma 3 and OLMo 3 have
        two, `local_and_global_angles`)."""
        return [self.rotary.angles(positions)] * len(self.layers)

    def local_and_global_angles(self, positions: torch.Tensor) -> list[RopeAngles]:
        """The angles of `self.local_rotary` in the sliding-window layers, of `self.rotary` in
        the others: for models with rope parameters by layer type."""
        full, local = self.rotary.angles(positions), self.local_rotary.angles(positions)
        return [full if window is None else local for window in self.windows]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        hidden = self.embed_tokens(token_ids)
        if self.embed_scale is None:
            return hidden
        if self.embed_scale_in_dtype:
            return hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        return hidden * self.embed_scale

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[B, H] -> [B, vocab] in the model's dtype on rank 0, None elsewhere. The sampler
        widens bf16 logits to float32 where it needs to (a greedy row's argmax does not)."""
        return self.lm_head(hidden)

    def checkpoint_name(self, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor, None for one to skip."""
        name = hf_name.removeprefix("model.")
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = self.checkpoint_name(hf_name)
            if name is None:
                continue
            shard_id: object = None
            for ours, theirs, shard in self.stacked_params:
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
        expected: set[str] = set()
        for name, _ in self.named_parameters():
            merged = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
            shards = _SHARDS.get(merged) if self._is_stacked(merged) else None
            if shards:
                expected.update(f"{name}:{s}" for s in shards)
            else:
                expected.add(name)
        return expected

    def _is_stacked(self, module_name: str) -> bool:
        return any(ours == module_name for ours, _, _ in self.stacked_params)
