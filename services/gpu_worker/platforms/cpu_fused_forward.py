"""The Llama family's forward pass on a CPU in bf16 or float32 as one loop of C calls, a forward
pass the CPU platform builds for a plain `LlamaForCausalLM` (no other architecture: it is the
Llama layer's ops in the Llama layer's order).

On a CPU with AVX512-BF16 every op of a decoder layer is one of our C kernels already: the
residual add with RMSNorm, the packed bf16 products, the fused SwiGLU, the rotary embedding,
the KV write and paged attention. Between them the module path spent ~15% of a 16-sequence
decode step in Python (module calls, wrappers checking shapes and dtypes again, views and
splits), and more of a step with few sequences. Here those checks run once, when the model is
loaded (which kernels, which weights, which layouts); a step allocates its buffers once and
calls the kernels layer after layer with raw pointers. The kernels and their order are the
module path's, so the hidden states are the same bits (up to the modules' 512 rows, below).

On a CPU with AMX-BF16 the products run on AMX tiles (up to `cpu_small_gemm.AMX_MAX_ROWS`
rows), and the MLP's gate-and-up product is followed by `silu_and_mul` instead of the fused
pass (the AMX product is the faster there; the bits are the fused pass's), as in the module
path.

In float32, where the weights are in `cpu_small_sgemm`'s panels (CPUs not made by Intel; on
Intel CPUs the platform keeps MKL's packing and the modules), the products are that kernel's
and the MLP its fused SwiGLU, as in the module path, and the pass takes a step whose chunks
the attention kernel takes (up to 16 new tokens a sequence in float32: decodes, drafts, short
prompts); a step with a longer chunk, SDPA's in the module path, goes through the modules. At
16 sequences in flight, in-process, AVX2 caps, the module path spent ~18% of the main thread in
Python and torch between kernels (while the other thread waited); the pass: 1.10-1.12x output
tok/s.

`CpuFusedForward.build(model)` is None where this does not apply (another architecture, not
a CPU, neither bf16 nor float32, tensor parallel, a kernel missing, a bias, another
activation), and a step goes through the modules when its rows are more than the pass takes
(`cpu_small_gemm.fused_max_rows`: without AMX, 2048, more than the modules' products take,
`cpu_small_gemm.max_rows`, 512; between the two the modules multiply with oneDNN, so a step
of 513-2048 rows gets other bits here than through the modules, as it would from another
product).
`PAGEDSERVE_CPU_FUSED_FORWARD=0` turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels import (
    cpu_kv_write,
    cpu_paged_attention,
    cpu_rms_norm,
    cpu_rotary,
    cpu_small_gemm,
    cpu_small_sgemm,
)
from pagedserve.services.gpu_worker.attention.base import AttentionMetadata
from pagedserve.services.gpu_worker.attention.torch_backend import (
    KernelSplit,
    TorchAttentionBackend,
    kernel_split,
)
from pagedserve.services.gpu_worker.layers.activation import SiluAndMul
from pagedserve.services.gpu_worker.layers.decoder_layer import PreNormDecoderLayer
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.models.llama import LlamaForCausalLM
from pagedserve.services.gpu_worker.parallel_state import get_tp_world_size
from pagedserve.services.gpu_worker.platforms.cpu_prepack import (
    Bf16Packing,
    Fp32Packing,
    packing_of,
)
from pagedserve.shared.options import switch_on

SWITCH = "PAGEDSERVE_CPU_FUSED_FORWARD"
# float32 products take any rows; the pass takes a float32 step whose chunks are all short
# enough for the attention kernel (`cpu_paged_attention.max_query_len`)
FP32_MAX_ROWS = 1 << 16


@dataclass(frozen=True, slots=True)
class _LayerPointers:
    """A decoder layer's weights as the kernels take them."""

    input_norm: int
    post_attention_norm: int
    qkv: int  # packed panels
    o: int
    gate_up: int
    down: int


@dataclass(frozen=True, slots=True)
class _Shape:
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def attention_width(self) -> int:
        return self.num_heads * self.head_dim


def _panels(layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """The layer's weight in the kernel's panels, if it has them and no bias: bf16's for the
    `vdpbf16ps` and AMX tiles (one layout), float32's for `cpu_small_sgemm` (not MKL's)."""
    packed = packing_of(layer)
    if getattr(layer, "bias", None) is not None:
        return None
    if dtype == torch.bfloat16 and isinstance(packed, Bf16Packing):
        return packed.few_rows
    if dtype == torch.float32 and isinstance(packed, Fp32Packing):
        return packed.kernel
    return None


def _layer_pointers(layer: PreNormDecoderLayer, dtype: torch.dtype) -> _LayerPointers | None:
    attn, mlp = layer.self_attn, layer.mlp
    if attn.q_norm is not None or not isinstance(mlp.act_and_mul, SiluAndMul):
        return None
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    panels = [_panels(m, dtype) for m in linears]
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    if any(p is None for p in panels) or any(
        w.dtype != dtype or not w.is_contiguous() for w in norms
    ):
        return None
    qkv, o, gate_up, down = (p.data_ptr() for p in panels)  # type: ignore[union-attr]
    return _LayerPointers(norms[0].data_ptr(), norms[1].data_ptr(), qkv, o, gate_up, down)


def _kernels_ready(shape: _Shape, dtype: torch.dtype) -> bool:
    if dtype == torch.bfloat16:
        products = (
            cpu_small_gemm.load() is not None
            and cpu_small_gemm.takes_mlp(1, shape.hidden, shape.intermediate)
            and cpu_paged_attention.uses_bf16_dot(shape.head_dim)  # chunks of any length
        )
    else:
        products = (
            cpu_small_sgemm.takes_swiglu(shape.intermediate)
            and cpu_paged_attention.load() is not None
            and shape.head_dim % 8 == 0
        )
    return (
        products
        and cpu_rms_norm.load() is not None
        and shape.hidden <= cpu_rms_norm.MAX_HIDDEN
        and cpu_rotary.load() is not None
        and cpu_kv_write.load() is not None
    )


class CpuFusedForward:
    """`LlamaForCausalLM.forward` for a CPU bf16 or float32 model, see the module docstring.
    Called as the model is, it takes the steps whose rows the products take (float32: and
    whose chunks the attention kernel takes) and leaves the others to the modules."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        shape: _Shape,
        layers: list[_LayerPointers],
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.model = model
        self.shape = shape
        self.layers = layers
        self.dtype = dtype
        self.is_bf16 = int(dtype == torch.bfloat16)  # the C kernels' dtype flag
        self.element_bytes = torch.empty(0, dtype=dtype).element_size()
        first = model.layers[0]
        self.eps = [(x.input_layernorm.eps, x.post_attention_layernorm.eps) for x in model.layers]
        self.scale = first.self_attn.attn.scale
        widths = (shape.hidden, shape.attention_width, shape.intermediate)
        if self.is_bf16:
            self.max_rows = min(cpu_small_gemm.fused_max_rows(width) for width in widths)
            # by K: the AMX tiles where the CPU has them and they take K, else `vdpbf16ps`
            self.product = {k: cpu_small_gemm.product_for(k) for k in widths}
            self.fuses_swiglu = cpu_small_gemm.fuses_swiglu(1, shape.hidden, shape.intermediate)
            self.swiglu = cpu_small_gemm.load().small_gemm_swiglu
            self.silu_and_mul = cpu_small_gemm.load().silu_and_mul
        else:
            library = cpu_small_sgemm.load()
            self.max_rows = FP32_MAX_ROWS
            self.product = dict.fromkeys(widths, library.small_sgemm)
            self.fuses_swiglu = True
            self.swiglu = library.small_sgemm_swiglu
        self.norm = cpu_rms_norm.load().add_rms_norm
        self.rotate = cpu_rotary.load().rotate_in_place
        self.write_kv = cpu_kv_write.load().write_kv_rows
        self.attend = cpu_paged_attention.load().paged_attention

    @classmethod
    def build(cls, model: BaseCausalLM) -> CpuFusedForward | None:
        """The fused forward of `model`, or None where it does not apply."""
        if type(model) is not LlamaForCausalLM:  # a subclass may change any step
            return None
        if any(spec.sliding_window is not None for spec in model.kv_cache_specs()):
            return None  # the C attention kernel has no window
        embed = model.embed_tokens.weight
        first = model.layers[0].self_attn
        if (
            not switch_on(SWITCH)
            or embed.device.type != "cpu"
            or embed.dtype not in (torch.bfloat16, torch.float32)
            or get_tp_world_size() != 1
            or not isinstance(first.attn, TorchAttentionBackend)
            or model.norm.weight.dtype != embed.dtype
            or model.rotary.cos.dtype != torch.float32  # the rotary kernel's angles
        ):
            return None
        shape = _Shape(
            hidden=embed.shape[1],
            num_heads=first.num_heads,
            num_kv_heads=first.num_kv_heads,
            head_dim=first.head_dim,
            intermediate=model.layers[0].mlp.gate_up_proj.weight.shape[0] // 2,
        )
        if not _kernels_ready(shape, embed.dtype):
            return None
        layers = [_layer_pointers(layer, embed.dtype) for layer in model.layers]
        if any(p is None for p in layers):
            return None
        return cls(model, shape, layers, embed.dtype)  # type: ignore[arg-type]

    def takes(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.max_rows

    def takes_step(self, num_tokens: int, metadata: AttentionMetadata) -> bool:
        """The pass takes this step: its rows, and every sequence's new tokens in the
        attention kernel (float32: chunks of up to `max_query_len`; longer ones are SDPA's,
        through the modules)."""
        if not self.takes(num_tokens):
            return False
        return bool(self.is_bf16) or not self._split(metadata).long

    def __call__(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] final hidden states
        if self.takes_step(token_ids.shape[0], metadata):
            return self.forward(token_ids, positions, kv_caches, metadata)
        return self.model(token_ids, positions, kv_caches, metadata)

    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] final hidden states
        s, num_tokens = self.shape, int(token_ids.shape[0])
        k_cache = kv_caches[0][0]
        if k_cache.dtype != self.dtype or not k_cache.is_contiguous():
            raise ValueError(f"the KV cache must be contiguous {self.dtype}, got {k_cache.dtype}")
        hidden = self.model.embed_tokens(token_ids).contiguous()
        cos, sin = self.model.rotary.angles(positions)
        step = self._attention_step(metadata)
        slots = metadata.slot_mapping.contiguous()

        def empty(width: int) -> torch.Tensor:
            return torch.empty(num_tokens, width, dtype=self.dtype)

        normed, residual, out = empty(s.hidden), empty(s.hidden), empty(s.hidden)
        qkv, attended, act = empty(s.qkv_width), empty(s.attention_width), empty(s.intermediate)
        gate_up = act if self.fuses_swiglu else empty(2 * s.intermediate)
        tensors = (hidden, cos, sin, slots, normed, residual, out, qkv, attended, act, gate_up)
        (hidden_p, cos_p, sin_p, slots_p, normed_p, residual_p, out_p, qkv_p, attended_p,
         act_p, gate_up_p) = (t.data_ptr() for t in tensors)  # fmt: skip
        qkv_product, o_product, down_product = (
            self.product[k] for k in (s.hidden, s.attention_width, s.intermediate)
        )
        key_p = qkv_p + s.attention_width * self.element_bytes
        value_p = key_p + s.num_kv_heads * s.head_dim * self.element_bytes
        heads, kv_row = s.num_heads + s.num_kv_heads, s.num_kv_heads * s.head_dim
        x_p, x_residual = hidden_p, None  # the first layer's norm has no residual to add
        for layer, eps, (k_cache, v_cache) in zip(self.layers, self.eps, kv_caches, strict=True):
            # x (+ residual) -> normed; the sum is the next residual (x itself at layer 0)
            self._norm(x_p, x_residual, residual_p, normed_p, layer.input_norm, num_tokens, eps[0])
            x_residual = residual_p if x_residual is not None else hidden_p
            qkv_product(normed_p, num_tokens, s.hidden, s.hidden, layer.qkv, s.qkv_width, None,
                        qkv_p, s.qkv_width)  # fmt: skip
            self.rotate(qkv_p, num_tokens, heads, s.head_dim, s.qkv_width, cos_p, sin_p,
                        self.is_bf16)  # fmt: skip
            num_slots = k_cache.shape[0] * k_cache.shape[1]
            kv_bytes = self.element_bytes
            if self.write_kv(key_p, value_p, s.qkv_width, k_cache.data_ptr(), v_cache.data_ptr(),
                             num_slots, slots_p, num_tokens, kv_row, kv_bytes):  # fmt: skip
                raise ValueError(f"a slot of this step is past the caches' {num_slots}")
            self._attend(step, qkv_p, k_cache, v_cache, attended_p)
            o_product(attended_p, num_tokens, s.attention_width, s.attention_width, layer.o,
                      s.hidden, None, out_p, s.hidden)  # fmt: skip
            self._norm(out_p, x_residual, residual_p, normed_p, layer.post_attention_norm,
                       num_tokens, eps[1])  # fmt: skip
            x_residual = residual_p
            self._mlp_up(normed_p, num_tokens, layer.gate_up, gate_up_p, act_p)
            down_product(act_p, num_tokens, s.intermediate, s.intermediate, layer.down,
                         s.hidden, None, out_p, s.hidden)  # fmt: skip
            x_p = out_p
        final = empty(s.hidden)
        norm = self.model.norm
        self._norm(x_p, x_residual, residual_p, final.data_ptr(), norm.weight.data_ptr(),
                   num_tokens, norm.eps)  # fmt: skip
        return final

    def _norm(
        self, x: int, residual: int | None, sum_out: int, out: int, weight: int, rows: int,
        eps: float,
    ) -> None:  # fmt: skip
        """RMSNorm(x + residual) into `out`, the sum into `sum_out` (in place of `residual`
        is safe: the kernel reads a row whole before it writes it)."""
        if self.norm(x, residual, sum_out, out, weight, rows, self.shape.hidden, eps, self.is_bf16):
            raise ValueError(f"hidden size {self.shape.hidden} is over the RMSNorm kernel's")

    def _mlp_up(self, normed: int, rows: int, weight: int, gate_up: int, act: int) -> None:
        """silu(normed Wg^T) * (normed Wu^T) into `act`: in one fused pass, or (AMX) the
        product into `gate_up`, then `silu_and_mul`."""
        hidden, inter = self.shape.hidden, self.shape.intermediate
        if self.fuses_swiglu:
            self.swiglu(normed, rows, hidden, hidden, weight, inter, act, inter)
            return
        self.product[hidden](normed, rows, hidden, hidden, weight, 2 * inter, None, gate_up,
                             2 * inter)  # fmt: skip
        self.silu_and_mul(gate_up, rows, inter, 2 * inter, act, inter)

    def _split(self, metadata: AttentionMetadata) -> KernelSplit:
        return kernel_split(metadata, self.dtype, self.shape.head_dim)

    def _attention_step(self, metadata: AttentionMetadata) -> cpu_paged_attention.PreparedStep:
        """The kernel's arguments for the step's sequences, as the attention backend splits
        them (the `vdpbf16ps` kernel takes chunks of any length, so it takes them all)."""
        split = self._split(metadata)
        if split.long or split.short is None:
            raise ValueError("the fused forward needs every sequence in the attention kernel")
        return split.short

    def _attend(
        self,
        step: cpu_paged_attention.PreparedStep,
        qkv: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: int,
    ) -> None:
        s = self.shape
        tables, max_blocks, lens, starts, seqs, num_seqs = step.args
        status = self.attend(
            out, qkv, s.qkv_width, k_cache.data_ptr(), v_cache.data_ptr(), tables, max_blocks,
            lens, starts, seqs, num_seqs, s.num_heads, s.num_kv_heads, s.head_dim,
            k_cache.shape[1], self.scale, self.is_bf16,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("the CPU paged attention kernel could not allocate its scratch")
