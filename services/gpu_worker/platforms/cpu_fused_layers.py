"""A model's decoder layers as the CPU fused forward pass (`cpu_fused_forward.py`) takes them:
their widths and form (`PassShape`), and each layer's packed weights, biases, norms and
rotating or not as pointers for the C layer loop (`LayerPointers`), or None where a layer is
not one the loop computes (another layer class or norm, another activation, an MLP bias,
weights not in the kernels' panels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels import cpu_rms_norm
from pagedserve.services.gpu_worker.layers.activation import SiluAndMul
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.models.olmo2 import Olmo2DecoderLayer
from pagedserve.services.gpu_worker.platforms.cpu_prepack import (
    Bf16Packing,
    Fp32Packing,
    packing_of,
)


@dataclass(frozen=True, slots=True)
class LayerPointers:
    """A decoder layer's weights as the kernels take them."""

    attention_norm: int  # the attention branch's norm: before it (Llama), or after (OLMo 2)
    mlp_norm: int
    attention_eps: float
    mlp_eps: float
    qkv: int  # packed panels
    o: int
    gate_up: int
    down: int
    qkv_bias: int | None  # None: the layer has none
    o_bias: int | None
    q_norm: int | None  # RMSNorm weights of each head (Qwen3) or the projection; None: none
    k_norm: int | None
    head_norm_eps: float
    rotates: bool  # False: SmolLM3's NoPE layers


@dataclass(frozen=True, slots=True)
class PassShape:
    """The model's widths and its layers' form, the same in every layer."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    post_norms: bool = False  # OLMo 2's layers: a norm after each branch
    qk_norm_whole: bool = False  # OLMo 2's q/k norms: over the whole projection, not each head

    @classmethod
    def of(cls, model: torch.nn.Module) -> PassShape:
        """The shape of `model`'s layers, read from its first (`layer_pointers` holds every
        layer to it)."""
        first = model.layers[0]
        attn = first.self_attn
        return cls(
            hidden=model.embed_tokens.weight.shape[1],
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_dim=attn.head_dim,
            intermediate=first.mlp.gate_up_proj.weight.shape[0] // 2,
            post_norms=type(first) is Olmo2DecoderLayer,
            qk_norm_whole=attn.q_norm is not None and not attn.norm_each_head,
        )

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def attention_width(self) -> int:
        return self.num_heads * self.head_dim


def _panels(layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """The layer's weight in the kernel's panels, if it has them: bf16's for the `vdpbf16ps`
    and AMX tiles (one layout), float32's for `cpu_small_sgemm` (not MKL's)."""
    packed = packing_of(layer)
    if dtype == torch.bfloat16 and isinstance(packed, Bf16Packing):
        return packed.few_rows
    if dtype == torch.float32 and isinstance(packed, Fp32Packing):
        return packed.kernel
    return None


def _branch_norms(layer: torch.nn.Module, post_norms: bool) -> tuple[RMSNorm, RMSNorm] | None:
    """The attention branch's norm and the MLP branch's: before each (Llama's layer), or after
    where `post_norms` (OLMo 2's); None for any other layer."""
    if not post_norms and type(layer) is PreNormDecoderLayer:
        return layer.input_layernorm, layer.post_attention_layernorm
    if post_norms and type(layer) is Olmo2DecoderLayer:
        return layer.post_attention_layernorm, layer.post_feedforward_layernorm
    return None


def layer_pointers(
    layer: PreNormDecoderLayer | Olmo2DecoderLayer, dtype: torch.dtype, shape: PassShape
) -> LayerPointers | None:
    """The layer as the C loop takes it, or None where the loop does not compute it (see the
    top) or it is not of the model's `shape` (its norms' places, its q/k norms' span)."""
    attn, mlp = layer.self_attn, layer.mlp
    branch_norms = _branch_norms(layer, shape.post_norms)
    if branch_norms is None or any(type(n) is not RMSNorm for n in branch_norms):
        return None
    if not isinstance(mlp.act_and_mul, SiluAndMul):
        return None
    head_norms = _head_norms(attn, dtype, shape.qk_norm_whole)
    if head_norms is None:
        return None
    if _bias(mlp.gate_up_proj) is not None or _bias(mlp.down_proj) is not None:
        return None  # Llama's mlp_bias: the fused SwiGLU adds none
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    panels = [_panels(m, dtype) for m in linears]
    norms = tuple(n.weight for n in branch_norms)
    biases = [_bias(m) for m in linears[:2]]
    if (
        any(p is None for p in panels)
        or any(w.dtype != dtype or not w.is_contiguous() for w in norms)
        or any(b is not None and (b.dtype != dtype or not b.is_contiguous()) for b in biases)
    ):
        return None
    qkv, o, gate_up, down = (p.data_ptr() for p in panels)  # type: ignore[union-attr]
    qkv_bias, o_bias = (None if b is None else b.data_ptr() for b in biases)
    return LayerPointers(
        norms[0].data_ptr(),
        norms[1].data_ptr(),
        branch_norms[0].eps,
        branch_norms[1].eps,
        qkv,
        o,
        gate_up,
        down,
        qkv_bias,
        o_bias,
        *head_norms,
        attn.use_rope,
    )


def _head_norms(attn: torch.nn.Module, dtype: torch.dtype, whole: bool) -> tuple | None:
    """(q_norm, k_norm, eps) as the loop takes them: (None, None, 0.0) without q/k norms;
    None where the layer's are not RMSNorms of each head (Qwen3), or of the whole projection
    where `whole` (OLMo 2), with one eps for both."""
    q_norm, k_norm = attn.q_norm, attn.k_norm
    if q_norm is None:
        return None, None, 0.0
    norms = (q_norm, k_norm)
    if (
        attn.norm_each_head == whole
        or any(type(n) is not RMSNorm for n in norms)
        or any(n.weight.dtype != dtype or not n.weight.is_contiguous() for n in norms)
        or q_norm.eps != k_norm.eps
        or max(n.weight.shape[0] for n in norms) > cpu_rms_norm.MAX_HEAD
    ):
        return None
    return q_norm.weight.data_ptr(), k_norm.weight.data_ptr(), q_norm.eps


def _bias(layer: torch.nn.Module) -> torch.Tensor | None:
    return getattr(layer, "bias", None)
