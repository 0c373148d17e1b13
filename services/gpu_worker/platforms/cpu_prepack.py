"""Linear layers on the CPU: every weight packed once, at load time, for the library that
multiplies it, so that no decode step re-packs it.

- bf16 (oneDNN). `F.linear` on bf16 CPU tensors hands the weight to oneDNN, which reorders it
  into its blocked layout on every call; for decode batches that costs about as much as the
  product. Packed once the product is bit-identical, and measured (one thread, AVX512-BF16)
  on SmolLM2's shapes: gate/up 576x3072 at 1 row 146 -> 72 us, the LM head at 1 row 6.3 ->
  3.1 ms, 8-20% less at 64 rows. This is what PyTorch's inductor does when it freezes a model.
- fp32 on CPUs not made by Intel (AVX2 and FMA). MKL picks a generic code path there, and
  `kernels/cpu_small_sgemm.c` takes every product: it streams each weight once, in panels
  packed at load time, while up to 6 rows (12 with AVX-512) accumulate in registers,
  memory-bound at a few rows and near the multiply-add peak at a few dozen. On a 2-core AMD
  EPYC (Zen 4), SmolLM2's 121 linears and LM head, AVX2 caps, F.linear / MKL packed / the
  kernel: 1 row 49 / 33 / 18 ms, 4 rows 69 / 64 / 17, 16 rows 71 / 84 / 30, 64 rows 191 /
  185 / 95, 128 rows 308 / 297 / 185, 512 rows 1005 / 1015 / 894. Every output is one fused
  multiply-add chain over k, so a row's product does not depend on the rows batched with it.
- fp32 on Intel CPUs (MKL), or where the kernel is not built. On a Xeon a kernel of the
  design above was measured no faster than MKL's packed product at any row count. `F.linear`
  calls MKL's sgemm, which copies ("packs") the weight into its tile layout on every call: for a
  few rows against a large weight that copy is most of the work. MKL's packed API
  (`cblas_sgemm_pack` once, `cblas_sgemm_compute` per call, reached through
  `mkl._mkl_linear`) skips it. SmolLM2's 121 linears in a row, weights in DRAM as in a decode
  step, 2 threads, Intel Xeon, AVX2 caps: 2 rows 56 -> 34 ms, 16 rows 83 -> 56, 48 rows 144
  -> 120, 128 rows 353 -> 298. One row stays with `F.linear` (a gemv, which packs nothing
  and is 5% faster).

  `mkl._mkl_linear` takes the packed product only when its batch-size argument equals the
  row count it is given, and otherwise falls back to `F.linear`; it is passed the row count
  of each call. The weight is packed once, for `MKL_PACK_ROWS` rows: a packing made for 64
  rows served 2-512 rows correctly (to float rounding; the tests check it) and fastest of
  the sizes tried (1-64). Each output is the same dot product, its partial sums added in
  another order: the HF-exactness tests (fp32 greedy ids and logprobs) hold.

  MKL lays a packing out for the thread count it was made with, and one made on 1 thread
  ran 2-row to 48-row products on 2 threads no faster than `F.linear`. So the weights are
  packed on the most threads the worker will use (`cpu_threads.most_threads`); a packing
  made on 2 threads served 1 thread as fast as one made on 1 (the thread governor only
  lowers the count from there).

- bf16, few rows (AVX512-BF16 CPUs). A decode step's linears stream their weights from
  memory, and oneDNN's packed product took twice that: ~38-47 ms a step for SmolLM2-135M's
  linears and LM head at 1 to 16 rows on 2 cores. `kernels/cpu_small_gemm.c` streams them at
  memory speed (AMX: 1 row 2.1x, 16 rows 2.2x, 128 rows 1.3x faster), so bf16 weights are
  packed for it, and calls of up to `cpu_small_gemm.max_rows` rows go there. Where it has
  AMX (up to 128 rows) the oneDNN copy is not kept: past 128 rows `F.linear` is as fast as
  the packed product (64-512 rows, within 3%), and a third copy of the weights is saved.
  Its outputs are oneDNN's but for rare last-bit roundings (the sums run in another order).

A layer keeps its plain weight (the tied embedding, tensor-parallel loading and anything that
reads parameters still see it); the packed copy lives in its linear method, `CpuPackedLinear`,
which the CPU platform gives every packable layer once the weights are loaded. It costs one
more copy of the linear weights in memory (two for bf16 on a CPU with AVX512-BF16 but no AMX:
oneDNN's and the few-row kernel's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels import cpu_small_gemm, cpu_small_sgemm
from pagedserve.services.gpu_worker.cpu_huge_pages import PanelArena
from pagedserve.services.gpu_worker.layers.fused_moe import StackedExperts
from pagedserve.services.gpu_worker.layers.linear_method import BaseLinearMethod

MKL_PACK_ROWS = 64  # the row count fp32 weights are packed for (see the module's note)


def can_prepack(weight: torch.Tensor) -> bool:
    """True for a 2-D CPU weight in a dtype this CPU's libraries can pack: bf16 where oneDNN
    has bf16 kernels, fp32 where the float32 kernel builds or torch was built with MKL."""
    if weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if weight.dtype == torch.bfloat16:
        return torch.backends.mkldnn.is_available() and bool(
            torch.ops.mkldnn._is_mkldnn_bf16_supported()
        )
    if weight.dtype == torch.float32:
        mkl = torch.backends.mkl.is_available() and torch.backends.mkldnn.is_available()
        return mkl or cpu_small_sgemm.available()
    return False


@dataclass(frozen=True, slots=True)
class Bf16Packing:
    """A bf16 weight packed for the few-row kernel (`kernels/cpu_small_gemm.c`) where the CPU
    has AVX512-BF16, and for oneDNN unless the kernel's AMX tiles take it (then `F.linear`
    serves the rows past them)."""

    onednn: torch.Tensor | None
    few_rows: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class Fp32Packing:
    """A float32 weight packed for one product: the float32 kernel's panels
    (`kernels/cpu_small_sgemm.c`) or MKL's packed layout; the other is None."""

    kernel: torch.Tensor | None
    mkl: torch.Tensor | None


@functools.cache
def cpu_is_intel() -> bool:
    """MKL runs its best code here (it picks a generic path on other vendors' CPUs)."""
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def fp32_uses_kernel() -> bool:
    """fp32 products go through the float32 kernel: it is built, and MKL is not at its best
    here (a CPU not made by Intel) or not in this torch."""
    if not cpu_small_sgemm.available():
        return False
    return not (cpu_is_intel() and torch.backends.mkl.is_available())


def panel_numel(weight: torch.Tensor) -> int:
    """Elements of the kernel's panels `pack_weight` lays a [out, in] weight out in (0: it
    takes none here, only MKL's or oneDNN's layouts)."""
    num_out, num_in = weight.shape
    if weight.dtype == torch.float32:
        return cpu_small_sgemm.packed_numel(num_out, num_in) if fp32_uses_kernel() else 0
    return cpu_small_gemm.packed_numel(num_out, num_in) if cpu_small_gemm.load() is not None else 0


def _panels(weight: torch.Tensor, arena: PanelArena | None) -> torch.Tensor | None:
    """The arena's next slice for the weight's panels (None: no arena, or no panels)."""
    numel = panel_numel(weight)
    return arena.take(numel, weight.dtype) if arena is not None and numel else None


def _pack_fp32(weight: torch.Tensor, arena: PanelArena | None) -> Fp32Packing:
    if fp32_uses_kernel():
        return Fp32Packing(cpu_small_sgemm.pack(weight, _panels(weight, arena)), None)
    return Fp32Packing(
        None, torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), MKL_PACK_ROWS)
    )


def pack_weight(weight: torch.Tensor, arena: PanelArena | None = None) -> Fp32Packing | Bf16Packing:
    """The packed copies of a [out, in] weight: for fp32 the kernel's or MKL's; for bf16,
    oneDNN's blocked one (whose batch-size hint does not matter: the same packing served 1 to
    300 rows equally well) and the few-row kernel's. The kernel's panels go into `arena`'s
    next slice where one is given (sized by `panel_numel`)."""
    if weight.dtype == torch.float32:
        return _pack_fp32(weight, arena)
    few_rows = None
    if cpu_small_gemm.load() is not None:
        few_rows = cpu_small_gemm.pack(weight, _panels(weight, arena))
    if (
        few_rows is not None
        and cpu_small_gemm.max_rows(weight.shape[1]) == cpu_small_gemm.AMX_MAX_ROWS
    ):
        return Bf16Packing(None, few_rows)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # AVX2: oneDNN cannot pack bf16
        return Bf16Packing(None, few_rows)
    return Bf16Packing(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1), few_rows)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed_weight: Fp32Packing | Bf16Packing | None = None,
) -> torch.Tensor:
    """x W^T (+ b), through the packed weight when the layer has one."""
    if packed_weight is None:
        return F.linear(x, weight, bias)
    num_rows = x.numel() // x.shape[-1]
    if isinstance(packed_weight, Bf16Packing):
        if packed_weight.few_rows is not None and num_rows <= cpu_small_gemm.max_rows(x.shape[-1]):
            return cpu_small_gemm.linear(x, packed_weight.few_rows, weight.shape[0], bias)
        if packed_weight.onednn is None:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed_weight.onednn, bias, "none", [], "")
    if packed_weight.kernel is not None:
        return cpu_small_sgemm.linear(x, packed_weight.kernel, weight.shape[0], bias)
    if packed_weight.mkl is None or num_rows <= 1:  # a gemv packs nothing, F.linear is as fast
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed_weight.mkl, weight, bias, num_rows)


def swiglu(x: torch.Tensor, weight: torch.Tensor, packed_weight: object) -> torch.Tensor | None:
    """silu(x Wg^T) * (x Wu^T) for a merged [gate; up] `weight`: one fused pass of the bf16
    kernel (`cpu_small_gemm.swiglu`) where its `vdpbf16ps` packing takes these rows; elsewhere
    (the AMX tiles, more rows than the kernel takes) the product, then the kernel's
    `silu_and_mul`, which rounds as the fused pass does (and is 1.31x torch's two ops at 2048
    rows, `benchmarks/silu_and_mul.py`). float32 weights in the float32 kernel's panels: its
    fused pass (`cpu_small_sgemm.swiglu`). None where the kernel is not built or the width is
    off its panels: torch's ops."""
    num_inter, num_in = weight.shape[0] // 2, x.shape[-1]
    if isinstance(packed_weight, Fp32Packing):
        return _fp32_swiglu(x, num_inter, packed_weight)
    if (
        not isinstance(packed_weight, Bf16Packing)
        or x.dtype != torch.bfloat16
        or cpu_small_gemm.load() is None
        or num_inter % cpu_small_gemm.PANEL_COLUMNS
    ):
        return None
    num_rows = x.numel() // num_in
    if packed_weight.few_rows is not None and cpu_small_gemm.fuses_swiglu(
        num_rows, num_in, num_inter
    ):
        return cpu_small_gemm.swiglu(x, packed_weight.few_rows, num_inter)
    return cpu_small_gemm.silu_and_mul(linear(x, weight, None, packed_weight))


def _fp32_swiglu(
    x: torch.Tensor, num_inter: int, packed_weight: Fp32Packing
) -> torch.Tensor | None:
    """The float32 kernel's fused pass where its panels hold the weight (not MKL's) and the
    width is whole panels: torch's silu and multiplication over the [rows, 2 x num_inter]
    product cost 37-46 us a token for SmolLM2-135M (30 layers, AVX2, 2 threads) on top of it."""
    if packed_weight.kernel is None or x.dtype != torch.float32:
        return None
    if not cpu_small_sgemm.takes_swiglu(num_inter):
        return None
    return cpu_small_sgemm.swiglu(x, packed_weight.kernel, num_inter)


class CpuPackedLinear(BaseLinearMethod):
    """The linear method of a layer whose weight is packed (see the module's note)."""

    def __init__(self, packing: Fp32Packing | Bf16Packing) -> None:
        self.packing = packing

    def apply(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return linear(x, weight, bias, self.packing)

    def apply_silu_and_mul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        return swiglu(x, weight, self.packing)


def packing_of(layer: nn.Module) -> Fp32Packing | Bf16Packing | None:
    """The layer's packed weight, if its linear method is the packed one."""
    method = getattr(layer, "linear_method", None)
    return method.packing if isinstance(method, CpuPackedLinear) else None


def _expert_weights(experts: StackedExperts) -> list[tuple[str, int, torch.Tensor]]:
    return [
        (name, expert, weight)
        for name in ("w13_weight", "w2_weight")
        for expert, weight in enumerate(getattr(experts, name))
        if can_prepack(weight)
    ]


def prepack_experts(experts: StackedExperts, arena: PanelArena | None = None) -> int:
    """Give each expert's gate/up and down products the packed method (a MoE layer's
    experts are one stacked parameter each, not linear layers); returns how many."""
    weights = _expert_weights(experts)
    for name, expert, weight in weights:
        experts.linear_methods[name, expert] = CpuPackedLinear(pack_weight(weight, arena))
    return len(weights)


def prepack_linears(model: nn.Module, num_threads: int | None = None) -> int:
    """Give every layer of `model` that has a linear method and a packable weight the packed
    method, packing on `num_threads` threads (default: the current count); returns how many
    were packed. The kernel's panels of all of them share one arena in huge pages
    (`cpu_huge_pages`), in the order of the model's modules."""
    linears = [m for m in model.modules() if hasattr(m, "linear_method") and can_prepack(m.weight)]
    experts = [m for m in model.modules() if isinstance(m, StackedExperts) and m not in linears]
    weights = [m.weight for m in linears] + [w for e in experts for _, _, w in _expert_weights(e)]
    arena = PanelArena([panel_numel(w) * w.element_size() for w in weights])
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or previous_threads)
    try:
        for module in linears:
            module.linear_method = CpuPackedLinear(pack_weight(module.weight, arena))
        return len(linears) + sum(prepack_experts(e, arena) for e in experts)
    finally:
        torch.set_num_threads(previous_threads)
