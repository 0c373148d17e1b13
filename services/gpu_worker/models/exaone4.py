"""EXAONE 4.0: OLMo 2's post-norm layer (a norm after each branch) with Qwen3's RMSNorm of each
query and key head. With a `sliding_window`, the window layers (`layer_types`) rotate their
queries and keys and the full-attention layers attend without position embedding (NoPE);
without one, every layer attends to everything and rotates."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value
from pagedserve.services.gpu_worker.models.olmo2 import post_norm_layer


class Exaone4ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        eps = config_value(config, "rms_norm_eps", 1e-5)
        head_norm = partial(RMSNorm, eps=eps)
        hybrid = getattr(config, "sliding_window", None) is not None
        self.layers = nn.ModuleList(
            post_norm_layer(
                config,
                backend_cls,
                eps,
                head_norm=head_norm,
                sliding_window=window,
                use_rope=not hybrid or window is not None,
            )
            for window in self.windows
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, self.head_dim)
