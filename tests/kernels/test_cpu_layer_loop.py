"""The C layer loop's interface (`kernels/cpu_layer_loop.py`): its ctypes structs mirror the C
ones, and its statuses become the fused forward's errors. That it computes the module path's
bits, and refuses a slot past the caches, is tested through the fused forward
(tests/unit/gpu_worker/test_cpu_fused_forward*.py)."""

from __future__ import annotations

import ctypes

import pytest

from pagedserve.kernels import cpu_layer_loop
from pagedserve.services.gpu_worker.platforms.cpu_fused_forward import CpuFusedForward

pytestmark = pytest.mark.skipif(cpu_layer_loop.load() is None, reason="no C compiler here")


def test_the_ctypes_structs_have_the_c_structs_sizes():
    assert cpu_layer_loop.c_struct_sizes() == [ctypes.sizeof(s) for s in cpu_layer_loop.STRUCTS]


def test_field_offsets_follow_c_layout():
    """float then int32s after seven int64: no padding between them, 8-byte end alignment."""
    shape = cpu_layer_loop.LayerShape
    assert shape.scale.offset == 7 * 8 and shape.is_bf16.offset == 7 * 8 + 4
    assert shape.qk_norm_whole.offset == 7 * 8 + 12 and ctypes.sizeof(shape) == 9 * 8
    assert cpu_layer_loop.LayerWeights.attention_eps.offset == 13 * 8  # twelve pointers, an int64


@pytest.mark.parametrize(
    ("status", "error", "words"),
    [
        (cpu_layer_loop.SLOT_PAST_CACHE, ValueError, "past the caches"),
        (cpu_layer_loop.NORM_TOO_WIDE, ValueError, "RMSNorm"),
        (cpu_layer_loop.NO_SCRATCH, MemoryError, "scratch"),
        (99, RuntimeError, "status 99"),
    ],
)
def test_each_status_is_an_error_that_says_what_failed(status, error, words):
    with pytest.raises(error, match=words):
        CpuFusedForward._check(status)


def test_ok_is_no_error():
    CpuFusedForward._check(cpu_layer_loop.OK)


def test_a_missing_function_is_null():
    assert cpu_layer_loop.address_of(None) is None
    assert cpu_layer_loop.address_of(cpu_layer_loop.load().run_decoder_layers) > 0
