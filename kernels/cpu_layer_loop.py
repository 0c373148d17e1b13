"""A decoder stack's layers for one step in one C call (`cpu_layer_loop.c`): the layer loop of
the CPU's fused forward pass (`services/gpu_worker/platforms/cpu_fused_forward.py`), built with
the machine's C compiler on first use (`kernels/cpu_build.py`) and loaded through ctypes.

The loop calls the other CPU kernels through the function pointers given here, so each stays
its own library and a step computes the bits the same calls made from Python did. The
structs below mirror the C ones field for field.

No compiler, or a failed build: `load()` returns None, says why once in the log, and the model
keeps its modules. `PAGEDSERVE_CPU_FUSED_FORWARD=0` turns it off with the fused pass.
"""

from __future__ import annotations

import ctypes

from pagedserve.kernels import cpu_build

KERNEL = cpu_build.CKernel(
    source="cpu_layer_loop.c",
    switch="PAGEDSERVE_CPU_FUSED_FORWARD",
    what="CPU decoder layer loop",
    functions=("run_decoder_layers", "layer_loop_struct_sizes"),
)
load = KERNEL.loader()

# run_decoder_layers' statuses (the C enum)
OK, NORM_TOO_WIDE, SLOT_PAST_CACHE, NO_SCRATCH = 0, 1, 2, 3

_pointer, _int64, _float, _int32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32


class LayerKernels(ctypes.Structure):
    _fields_ = [
        (name, _pointer)
        for name in (
            "qkv_product", "o_product", "down_product", "gate_up_product", "swiglu",
            "silu_and_mul", "norm", "norm_add", "norm_heads", "rotate", "write_kv", "attend",
        )
    ]  # fmt: skip


class LayerShape(ctypes.Structure):
    _fields_ = [
        *[
            (name, _int64)
            for name in (
                "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate", "block_size",
                "element_bytes",
            )
        ],
        ("scale", _float),
        ("is_bf16", _int32),
        ("post_norms", _int32),
        ("qk_norm_whole", _int32),
    ]  # fmt: skip


class LayerWeights(ctypes.Structure):
    _fields_ = [
        *[
            (name, _pointer)
            for name in (
                "attention_norm", "mlp_norm", "qkv", "o", "gate_up", "down", "qkv_bias",
                "o_bias", "q_norm", "k_norm", "k_cache", "v_cache",
            )
        ],
        ("num_slots", _int64),
        ("attention_eps", _float),
        ("mlp_eps", _float),
        ("head_norm_eps", _float),
        ("rotates", _int32),
    ]  # fmt: skip


class StepBuffers(ctypes.Structure):
    _fields_ = [
        ("num_tokens", _int64),
        *[
            (name, _pointer)
            for name in (
                "hidden", "cos", "sin", "slots", "normed", "residual", "out", "qkv", "attended",
                "act", "gate_up", "block_tables",
            )
        ],
        ("max_blocks", _int64),
        ("seq_lens", _pointer),
        ("query_start", _pointer),
        ("seqs", _pointer),
        ("num_seqs", _int64),
        ("keep_rows", _pointer),
        ("num_keep", _int64),
    ]  # fmt: skip


STRUCTS = (LayerKernels, LayerShape, LayerWeights, StepBuffers)  # in C's order


def c_struct_sizes() -> list[int]:
    """sizeof of the C structs, in STRUCTS' order (the mirrors must match them)."""
    sizes = (ctypes.c_int64 * len(STRUCTS))()
    load().layer_loop_struct_sizes(ctypes.addressof(sizes))
    return list(sizes)


def address_of(function: ctypes._CFuncPtr | None) -> int | None:  # type: ignore[name-defined]
    """A loaded C function's address, for a LayerKernels field (None: NULL)."""
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


def run(
    kernels: LayerKernels,
    shape: LayerShape,
    weights: ctypes.Array[LayerWeights],
    buffers: StepBuffers,
) -> int:
    """All the layers of `weights` for the step of `buffers`; the status (OK or an error)."""
    return load().run_decoder_layers(
        ctypes.addressof(kernels), ctypes.addressof(shape), ctypes.addressof(weights),
        len(weights), ctypes.addressof(buffers),
    )  # fmt: skip
