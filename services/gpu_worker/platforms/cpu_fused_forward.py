"""The Llama family's forward pass on a CPU in bf16 or float32 as one loop of C calls, a forward
pass the CPU platform builds for a plain `LlamaForCausalLM` (Llama, Mistral, Qwen2, SmolLM2),
`Qwen3ForCausalLM` (the same layer with an RMSNorm of each query and key head before the
rotary embedding), `SmolLM3ForCausalLM` (the same layer, some layers without the rotary
embedding), `Ernie4_5ForCausalLM` (a Llama model once loaded), `Olmo2ForCausalLM` (the
Llama layer's ops with each norm after its branch, and q/k norms over the whole projection)
or `Exaone4ForCausalLM` without a window (OLMo 2's layer with q/k norms of each head), no
other architecture: it is those layers' ops in their order.

On a CPU with AVX512-BF16 every op of a decoder layer is one of our C kernels already: the
residual add with RMSNorm, the packed bf16 products, the fused SwiGLU, the rotary embedding,
the KV write and paged attention. Between them the module path spent ~15% of a 16-sequence
decode step in Python (module calls, wrappers checking shapes and dtypes again, views and
splits), and more of a step with few sequences. Here those checks run once, when the model is
loaded (which kernels, which weights, which layouts); a step allocates its buffers once and
hands them, with the layers' weights and caches, to one C call that runs the kernels layer
after layer (`kernels/cpu_layer_loop.c`: from Python, nine ctypes calls a layer cost ~0.3 ms
of a one-sequence bf16 decode step, ~1.3 ms at 64 sequences). The kernels and their order are
the module path's, so the hidden states are the same bits (up to the modules' 512 rows, below).

On a CPU with AMX-BF16 the products run on AMX tiles (up to `cpu_small_gemm.AMX_MAX_ROWS`
rows), and the MLP's gate-and-up product is followed by `silu_and_mul` instead of the fused
pass (the AMX product is the faster there; the bits are the fused pass's), as in the module
path.

In float32, where the weights are in `cpu_small_sgemm`'s panels (CPUs not made by Intel; on
Intel CPUs the platform keeps MKL's packing and the modules), the products are that kernel's
and the MLP its fused SwiGLU, as in the module path, and the pass takes a step whose chunks
the attention kernel takes: any, prompts on its float32 lanes (`cpu_attention_f32_lanes.h`),
where they take the head; else up to 16 new tokens a sequence, and a step with a longer chunk,
SDPA's, goes through the modules. At 16 sequences in flight, in-process, AVX2 caps, the module
path spent ~18% of the main thread in Python and torch between kernels (while the other thread
waited); the pass: 1.10-1.12x output tok/s. Prompt steps through the pass and the lanes, where
they had gone through the modules and SDPA: a burst of 64 prompts 1365 -> 1175 us a token
(`python -m benchmarks.prompt_lanes_ab`).

`CpuFusedForward.build(model)` is None where this does not apply (another architecture, not
a CPU, neither bf16 nor float32, tensor parallel, a kernel missing, an MLP bias, another
activation). The attention's biases (Qwen2's q/k/v, Llama's `attention_bias`) go into their
products, added before the one rounding as the modules add them. A step goes through the
modules when its rows are more than the pass takes (`cpu_small_gemm.fused_max_rows`: without
AMX, 2048, more than the modules' products take, `cpu_small_gemm.max_rows`, 512; between the
two the modules multiply with oneDNN, so a step of 513-2048 rows gets other bits here than
through the modules, as it would from another product).
`PAGEDSERVE_CPU_FUSED_FORWARD=0` turns it off.
"""

from __future__ import annotations

import torch

from pagedserve.kernels import (
    cpu_kv_write,
    cpu_layer_loop,
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
from pagedserve.services.gpu_worker.models.ernie4_5 import Ernie4_5ForCausalLM
from pagedserve.services.gpu_worker.models.exaone4 import Exaone4ForCausalLM
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.models.llama import LlamaForCausalLM
from pagedserve.services.gpu_worker.models.olmo2 import Olmo2ForCausalLM
from pagedserve.services.gpu_worker.models.qwen3 import Qwen3ForCausalLM
from pagedserve.services.gpu_worker.models.smollm3 import SmolLM3ForCausalLM
from pagedserve.services.gpu_worker.parallel_state import get_tp_world_size
from pagedserve.services.gpu_worker.platforms.cpu_fused_layers import (
    LayerPointers,
    PassShape,
    layer_pointers,
)
from pagedserve.shared.options import switch_on

SWITCH = "PAGEDSERVE_CPU_FUSED_FORWARD"
FUSED_ARCHITECTURES = (
    LlamaForCausalLM,
    Qwen3ForCausalLM,
    SmolLM3ForCausalLM,
    Ernie4_5ForCausalLM,  # its interleaved rotary pairs made rotate-half ones at load
    Olmo2ForCausalLM,  # post-norm layers (not OLMo 3: rotaries by layer type)
    Exaone4ForCausalLM,  # post-norm layers; without a window, every layer rotates
)
# float32 products take any rows; the pass takes a float32 step whose chunks the attention
# kernel all takes (`cpu_paged_attention.max_query_len`: any, on its float32 lanes, where they
# take the head)
FP32_MAX_ROWS = 1 << 16


def _kernels_ready(shape: PassShape, dtype: torch.dtype) -> bool:
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
        and cpu_layer_loop.load() is not None
    )


class CpuFusedForward:
    """`LlamaForCausalLM.forward` for a CPU bf16 or float32 model, see the module docstring.
    Called as the model is, it takes the steps whose rows the products take (float32: and
    whose chunks the attention kernel takes) and leaves the others to the modules."""

    def __init__(
        self,
        model: BaseCausalLM,  # one of FUSED_ARCHITECTURES
        shape: PassShape,
        layers: list[LayerPointers],
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.model = model
        self.shape = shape
        self.dtype = dtype
        self.is_bf16 = int(dtype == torch.bfloat16)  # the C kernels' dtype flag
        self.element_bytes = torch.empty(0, dtype=dtype).element_size()
        self.scale = model.layers[0].self_attn.attn.scale
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
        self.norm_add = cpu_rms_norm.load().rms_norm_add
        self.kernels = self._loop_kernels()
        # block_size 0 until the caches are bound (each step: the worker may reallocate them)
        self.loop_shape = cpu_layer_loop.LayerShape(
            shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim,
            shape.intermediate, 0, self.element_bytes, self.scale, self.is_bf16,
            shape.post_norms, shape.qk_norm_whole,
        )  # fmt: skip
        self.weights = (cpu_layer_loop.LayerWeights * len(layers))(*(
            cpu_layer_loop.LayerWeights(
                p.attention_norm, p.mlp_norm, p.qkv, p.o, p.gate_up, p.down, p.qkv_bias,
                p.o_bias, p.q_norm, p.k_norm, None, None, 0, p.attention_eps, p.mlp_eps,
                p.head_norm_eps, p.rotates,
            )
            for p in layers
        ))  # fmt: skip

    def _loop_kernels(self) -> cpu_layer_loop.LayerKernels:
        """The kernels the C layer loop calls, as function pointers."""
        s, address = self.shape, cpu_layer_loop.address_of
        fused = self.fuses_swiglu
        return cpu_layer_loop.LayerKernels(
            address(self.product[s.hidden]), address(self.product[s.attention_width]),
            address(self.product[s.intermediate]),
            None if fused else address(self.product[s.hidden]),
            address(self.swiglu) if fused else None,
            None if fused else address(self.silu_and_mul),
            address(self.norm), address(self.norm_add),
            address(cpu_rms_norm.load().rms_norm_heads),
            address(cpu_rotary.load().rotate_in_place),
            address(cpu_kv_write.load().write_kv_rows),
            address(cpu_paged_attention.load().paged_attention),
        )  # fmt: skip

    @classmethod
    def build(cls, model: BaseCausalLM) -> CpuFusedForward | None:
        """The fused forward of `model`, or None where it does not apply."""
        # the Llama layer's ops, Qwen3's q/k norms, SmolLM3's NoPE layers and OLMo 2's
        # post-norms among them (a subclass may change any step)
        if type(model) not in FUSED_ARCHITECTURES:
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
        shape = PassShape.of(model)
        if not _kernels_ready(shape, embed.dtype):
            return None
        layers = [layer_pointers(x, embed.dtype, shape) for x in model.layers]
        if any(p is None for p in layers):
            return None
        return cls(model, shape, layers, embed.dtype)

    def takes(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.max_rows

    def takes_prompts(self) -> bool:
        """Every chunk is the attention kernel's, however long (bf16 on the `vdpbf16ps` path,
        float32 on its float32 lanes), so a prompt step stays in the pass."""
        return cpu_paged_attention.max_query_len(self.dtype, self.shape.head_dim) is None

    def takes_step(self, num_tokens: int, metadata: AttentionMetadata) -> bool:
        """The pass takes this step: its rows, and every sequence's new tokens in the
        attention kernel (float32: chunks of up to `max_query_len`, any where its lanes take
        the head; longer ones are SDPA's, through the modules)."""
        if not self.takes(num_tokens):
            return False
        return bool(self.is_bf16) or not self._split(metadata).long

    takes_logit_rows = True  # see `forward`

    def __call__(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
        logit_rows: torch.Tensor | None = None,  # [R]
    ) -> torch.Tensor:  # [T, H] final hidden states
        if self.takes_step(token_ids.shape[0], metadata):
            return self.forward(token_ids, positions, kv_caches, metadata, logit_rows)
        return self.model(token_ids, positions, kv_caches, metadata, logit_rows=logit_rows)

    def forward(
        self,
        token_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        metadata: AttentionMetadata,
        logit_rows: torch.Tensor | None = None,  # [R]
    ) -> torch.Tensor:  # [T, H] final hidden states
        """The step's final hidden states. Given `logit_rows`, the last layer computes only
        those rows past attention (`cpu_layer_loop.c`), and the other rows come back zero:
        ~2.8% fewer multiply-adds in a prompt step of SmolLM2-135M, the same bits in those
        rows, every row's keys and values cached."""
        s, num_tokens = self.shape, int(token_ids.shape[0])
        k_cache = kv_caches[0][0]
        if k_cache.dtype != self.dtype or not k_cache.is_contiguous():
            raise ValueError(f"the KV cache must be contiguous {self.dtype}, got {k_cache.dtype}")
        self._bind_caches(kv_caches)
        hidden = self.model.embed_tokens(token_ids).contiguous()
        cos, sin = self.model.rotary.angles(positions)
        step = self._attention_step(metadata)
        slots = metadata.slot_mapping.contiguous()

        def empty(width: int) -> torch.Tensor:
            return torch.empty(num_tokens, width, dtype=self.dtype)

        normed, residual, out = empty(s.hidden), empty(s.hidden), empty(s.hidden)
        qkv, attended, act = empty(s.qkv_width), empty(s.attention_width), empty(s.intermediate)
        gate_up = act if self.fuses_swiglu else empty(2 * s.intermediate)
        tables, max_blocks, lens, starts, seqs, num_seqs = step.args
        keep = None if logit_rows is None else torch.unique(logit_rows.to(torch.int64))
        if keep is not None and keep.numel() and (keep[0] < 0 or keep[-1] >= num_tokens):
            raise ValueError(f"logit rows must lie in [0, {num_tokens}): got {logit_rows.tolist()}")
        buffers = cpu_layer_loop.StepBuffers(
            num_tokens, *(t.data_ptr() for t in (hidden, cos, sin, slots, normed, residual, out,
            qkv, attended, act, gate_up)), tables, max_blocks, lens, starts, seqs, num_seqs,
            None if keep is None else keep.data_ptr(), 0 if keep is None else keep.numel(),
        )  # fmt: skip
        self._check(cpu_layer_loop.run(self.kernels, self.loop_shape, self.weights, buffers))
        rows = num_tokens if keep is None else keep.numel()  # the first rows of out, residual
        final = torch.empty(rows, s.hidden, dtype=self.dtype)
        norm = self.model.norm
        # pre-norm: the norm of out + residual; post-norm: out is the stream itself
        last_residual = None if s.post_norms else residual.data_ptr()
        self._norm(out.data_ptr(), last_residual, residual.data_ptr(), final.data_ptr(),
                   norm.weight.data_ptr(), rows, norm.eps)  # fmt: skip
        if keep is None:
            return final
        return torch.zeros(num_tokens, s.hidden, dtype=self.dtype).index_copy_(0, keep, final)

    def _bind_caches(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Each layer's caches into its weights struct (the worker may reallocate them)."""
        if len(kv_caches) != len(self.weights):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.weights)} layers")
        for weights, (k_cache, v_cache) in zip(self.weights, kv_caches, strict=True):
            weights.k_cache, weights.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
            weights.num_slots = k_cache.shape[0] * k_cache.shape[1]
        self.loop_shape.block_size = kv_caches[0][0].shape[1]

    @staticmethod
    def _check(status: int) -> None:
        if status == cpu_layer_loop.SLOT_PAST_CACHE:
            raise ValueError("a slot of this step is past the caches' slots")
        if status == cpu_layer_loop.NORM_TOO_WIDE:
            raise ValueError("the hidden size is over the RMSNorm kernel's")
        if status == cpu_layer_loop.NO_SCRATCH:
            raise MemoryError("the CPU paged attention kernel could not allocate its scratch")
        if status != cpu_layer_loop.OK:
            raise RuntimeError(f"the CPU layer loop failed with status {status}")

    def _norm(
        self, x: int, residual: int | None, sum_out: int, out: int, weight: int, rows: int,
        eps: float,
    ) -> None:  # fmt: skip
        """RMSNorm(x + residual) into `out`, the sum into `sum_out` (in place of `residual`
        is safe: the kernel reads a row whole before it writes it)."""
        if self.norm(x, residual, sum_out, out, weight, rows, self.shape.hidden, eps, self.is_bf16):
            raise ValueError(f"hidden size {self.shape.hidden} is over the RMSNorm kernel's")

    def _split(self, metadata: AttentionMetadata) -> KernelSplit:
        return kernel_split(metadata, self.dtype, self.shape.head_dim)

    def _attention_step(self, metadata: AttentionMetadata) -> cpu_paged_attention.PreparedStep:
        """The kernel's arguments for the step's sequences, as the attention backend splits
        them (the `vdpbf16ps` kernel takes chunks of any length, so it takes them all)."""
        split = self._split(metadata)
        if split.long or split.short is None:
            raise ValueError("the fused forward needs every sequence in the attention kernel")
        return split.short
