"""SmolLM3: the Llama layer, with no position embedding in some layers (`no_rope_layers[i]`
is 0: NoPE, every fourth layer by default), whose queries and keys attend as projected. With
`use_sliding_window` a window is used where `layer_types` says so (the NoPE layers, as the
config derives them)."""

from __future__ import annotations

from typing import Any

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import DecoderLM, config_value, refuse
from pagedserve.services.gpu_worker.models.llama import llama_attention, llama_layer


def rope_layers(config: Any) -> list[bool]:
    """Whether each layer rotates its queries and keys, as Hugging Face's config derives it
    (`no_rope_layers`, else a NoPE layer every `no_rope_layer_interval`)."""
    num_layers = config.num_hidden_layers
    flags = getattr(config, "no_rope_layers", None)
    if flags is None:
        interval = config_value(config, "no_rope_layer_interval", 4)
        return [(i + 1) % interval != 0 for i in range(num_layers)]
    if len(flags) != num_layers or any(f not in (0, 1) for f in flags):
        refuse(config, f"no_rope_layers {flags}", f"{num_layers} flags, each 0 or 1")
    return [bool(f) for f in flags]


class SmolLM3ForCausalLM(DecoderLM):
    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        super().__init__(config, backend_cls)
        if not config_value(config, "use_sliding_window", False):
            self.windows = [None] * config.num_hidden_layers  # Hugging Face uses none then
        self.layers = nn.ModuleList(
            llama_layer(
                config,
                llama_attention(config, backend_cls, sliding_window=window, use_rope=use_rope),
            )
            for window, use_rope in zip(self.windows, rope_layers(config), strict=True)
        )
        self.norm = RMSNorm(config.hidden_size, config_value(config, "rms_norm_eps", 1e-6))
        self.rotary = rotary_from_config(config, self.head_dim)
