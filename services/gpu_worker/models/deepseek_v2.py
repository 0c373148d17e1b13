"""DeepSeek-V2 and DeepSeek-V3: multi-head latent attention (`layers/mla_attention.py`, a
compressed KV cache) and a mixture of experts with shared experts added plainly.

- The first `first_k_dense_replace` layers (and, where `moe_layer_freq` > 1, the layers off
  its beat) have a dense MLP of `intermediate_size`; the others `n_routed_experts` experts of
  `moe_intermediate_size` plus `n_shared_experts` shared ones in one MLP.
- V2 routes by softmax, `greedy` or `group_limited_greedy` (groups scored by their best
  expert), renormalised only where `norm_topk_prob` (as DeepSeek's code; transformers' V2
  never renormalises, and every released V2 config says false), scaled by
  `routed_scaling_factor`.
- V3 routes by sigmoid plus `e_score_correction_bias` (`noaux_tc`: groups scored by their two
  best experts), renormalised where `norm_topk_prob`, scaled.
- The softmax scale is qk_head_dim^-0.5, times mscale^2 with yarn (mscale =
  0.1 * mscale_all_dim * ln(factor) + 1), and the rotary cos/sin carry yarn's attention factor.
- The rotary dimensions are interleaved pairs (V3 where `rope_interleave`, V2 always).

The multi-token-prediction layers V3 checkpoints carry past `num_hidden_layers` are skipped;
quantized checkpoints (V3's FP8 release: `quantization_config`) are refused.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from torch import nn

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.fused_moe import FusedMoE
from pagedserve.services.gpu_worker.layers.mla_attention import MLAAttention, MLAShape
from pagedserve.services.gpu_worker.layers.mlp import GatedMLP
from pagedserve.services.gpu_worker.layers.moe_routing import Routing
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rope_scaling import rope_type_of
from pagedserve.services.gpu_worker.layers.rotary import rope_parameters, rotary_from_config
from pagedserve.services.gpu_worker.models.decoder_base import (
    STACKED_PARAMS,
    config_value,
    refuse,
)
from pagedserve.services.gpu_worker.models.gpt_oss import refuse_quantized
from pagedserve.services.gpu_worker.models.moe_base import MoEDecoderLM
from pagedserve.shared.kv_cache_spec import KVCacheSpec

# what each version routes by: (scoring, topk_methods it accepts)
_ROUTING = {
    "deepseek_v2": ("softmax", ("greedy", "group_limited_greedy")),
    "deepseek_v3": ("sigmoid", ("noaux_tc",)),
}


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(config: Any) -> float:
    """qk_head_dim^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 where it applies."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = rope_parameters(config)
    mscale_all_dim = rope.get("mscale_all_dim")
    if rope_type_of(rope) != "default" and mscale_all_dim:
        scale *= yarn_mscale(rope["factor"], mscale_all_dim) ** 2
    return scale


def mla_attention(config: Any, backend_cls: type[BaseAttentionBackend]) -> MLAAttention:
    shape = MLAShape(
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        q_lora_rank=getattr(config, "q_lora_rank", None),
        kv_lora_rank=config.kv_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim,
        v_head_dim=config.v_head_dim,
    )
    interleaved = config.model_type == "deepseek_v2" or config_value(
        config, "rope_interleave", True
    )
    return MLAAttention(
        shape,
        backend_cls,
        scale=softmax_scale(config),
        rope_interleaved=bool(interleaved),
        bias=bool(config_value(config, "attention_bias", False)),
    )


def deepseek_routing(config: Any) -> Routing:
    """The routing of `config` (see the module docstring); another scoring or top-k method
    is refused naming it."""
    scoring, methods = _ROUTING[config.model_type]
    stated_scoring = config_value(config, "scoring_func", scoring)
    if stated_scoring != scoring:
        refuse(config, f"scoring_func {stated_scoring!r}", f"{config.model_type}: {scoring!r}")
    method = config_value(config, "topk_method", methods[0])
    if method not in methods:
        refuse(config, f"topk_method {method!r}", f"{config.model_type}: {', '.join(methods)}")
    grouped = method != "greedy"
    return Routing(
        config.num_experts_per_tok,
        scoring=scoring,
        renormalize=bool(config_value(config, "norm_topk_prob", False)),
        num_groups=config_value(config, "n_group", 1) if grouped else 1,
        top_groups=config_value(config, "topk_group", 1) if grouped else 1,
        group_score="top2_sum" if method == "noaux_tc" else "max",
        scaling_factor=float(config_value(config, "routed_scaling_factor", 1.0)),
    )


def is_moe_layer(config: Any, index: int) -> bool:
    """Experts from layer `first_k_dense_replace` on, every `moe_layer_freq`-th layer."""
    first_moe = config_value(config, "first_k_dense_replace", 0)
    return index >= first_moe and index % config_value(config, "moe_layer_freq", 1) == 0


def deepseek_mlp(config: Any, index: int) -> nn.Module:
    act = config_value(config, "hidden_act", "silu")
    bias = bool(config_value(config, "mlp_bias", False))
    if not is_moe_layer(config, index):
        return GatedMLP(config.hidden_size, config.intermediate_size, act, bias=bias)
    num_shared = config_value(config, "n_shared_experts", 0)
    shared = None
    if num_shared:
        shared_size = config.moe_intermediate_size * num_shared
        # unreduced: FusedMoE adds its partial sum to the routed experts' before one reduce
        shared = GatedMLP(config.hidden_size, shared_size, act, bias=bias, reduce_results=False)
    return FusedMoE(
        config.hidden_size,
        config.moe_intermediate_size,
        config.n_routed_experts,
        deepseek_routing(config),
        hidden_act=act,
        shared_expert=shared,
        shared_expert_gated=False,
        correction_bias=config.model_type == "deepseek_v3",
    )


def check_supported(config: Any) -> None:
    """Refuse, naming it, what this implementation does not serve."""
    if config.model_type not in _ROUTING:
        refuse(config, f"model_type {config.model_type!r}", "deepseek_v2, deepseek_v3")
    refuse_quantized(config)  # V3's released weights are FP8 blocks with scales
    if not config_value(config, "n_routed_experts", 0):
        refuse(config, "n_routed_experts None (a DeepSeek model with no experts)", "experts")
    if config.model_type == "deepseek_v3" and config.n_routed_experts % config_value(
        config, "n_group", 1
    ):
        refuse(config, f"n_group={config.n_group}", "a divisor of n_routed_experts")


class DeepseekV2ForCausalLM(MoEDecoderLM):
    # q_proj is MLA's own query projection, not a part of a merged qkv
    stacked_params: ClassVar[tuple[tuple[str, str, object], ...]] = tuple(
        entry for entry in STACKED_PARAMS if entry[0] == "gate_up_proj"
    )

    def __init__(self, config: Any, backend_cls: type[BaseAttentionBackend]) -> None:
        check_supported(config)
        super().__init__(config, backend_cls)
        self.windows = [None] * config.num_hidden_layers
        eps = config_value(config, "rms_norm_eps", 1e-6)
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(
                mla_attention(config, backend_cls),
                deepseek_mlp(config, index),
                RMSNorm(config.hidden_size, eps),
                RMSNorm(config.hidden_size, eps),
            )
            for index in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.rotary = rotary_from_config(config, config.qk_rope_head_dim)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [layer.self_attn.shape.kv_cache_spec() for layer in self.layers]

    def checkpoint_name(self, hf_name: str) -> str | None:
        name = super().checkpoint_name(hf_name)
        if name is None or _layer_index(name) >= self.config.num_hidden_layers:
            return None  # the multi-token-prediction layers
        name = name.replace(".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias")
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """V3's differences are all in the config (see the module docstring)."""


def _layer_index(name: str) -> int:
    """The layer a parameter name is in (`layers.3.mlp...` -> 3), -1 outside the layers."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return -1
