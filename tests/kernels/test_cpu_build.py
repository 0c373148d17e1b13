"""The one loader of the C kernels: each kernel module declares a `CKernel`, and the loader
types every function it names from the prototype in the C source."""

from __future__ import annotations

import ctypes
import importlib

import pytest

from pagedserve.kernels import cpu_build
from pagedserve.shared.options import CPU_SWITCHES

KERNEL_MODULES = (
    "cpu_argmax", "cpu_kv_write", "cpu_paged_attention", "cpu_rms_norm", "cpu_rotary",
    "cpu_small_gemm", "cpu_small_sgemm",
)  # fmt: skip


def kernel_of(module: str) -> cpu_build.CKernel:
    return importlib.import_module(f"pagedserve.kernels.{module}").KERNEL


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_each_kernel_declares_a_source_a_known_switch_and_typed_functions(module):
    kernel = kernel_of(module)
    assert kernel.path.is_file() and kernel.path.suffix == ".c"
    assert kernel.switch in CPU_SWITCHES
    source = kernel.path.read_text()
    for name in kernel.functions:
        restype, argtypes = cpu_build.c_signature(source, name)
        assert restype in (None, ctypes.c_int, ctypes.c_int64), name
        assert all(t in (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float)
                   for t in argtypes), name  # fmt: skip


def test_prototypes_become_ctypes_signatures():
    source = """
static inline int helper(int x) { return x; }
int64_t count(void) { return 3; }
void scale_rows(const float *restrict x, int64_t rows,
                float factor, int is_bf16, char *out) {
}
"""
    assert cpu_build.c_signature(source, "count") == (ctypes.c_int64, [])
    assert cpu_build.c_signature(source, "scale_rows") == (
        None,
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p],
    )
    with pytest.raises(ValueError, match=r"no definition of missing\(\)"):
        cpu_build.c_signature(source, "missing")
    with pytest.raises(ValueError, match=r"C type 'double' has no ctypes mapping"):
        cpu_build.c_signature("void f(double x) {}", "f")


def test_a_loaded_kernel_has_its_functions_typed():
    library = kernel_of("cpu_rotary").loader()()
    if library is None:
        pytest.skip("no C compiler")
    assert library.rotate_in_place.restype is None
    assert library.rotate_in_place.argtypes[1] is ctypes.c_int64


def test_a_switched_off_or_unsupported_kernel_loads_nothing_and_says_why(monkeypatch, caplog):
    caplog.set_level("INFO")
    monkeypatch.setenv("PAGEDSERVE_CPU_ROTARY_KERNEL", "off")
    assert kernel_of("cpu_rotary").loader()() is None
    assert "CPU rotary embedding kernel turned off" in caplog.text
    unsupported = cpu_build.CKernel(
        "cpu_argmax.c", "PAGEDSERVE_CPU_ARGMAX_KERNEL", "test kernel", ("argmax_rows",),
        unsupported=lambda: "not on this machine",
    )  # fmt: skip
    assert unsupported.loader()() is None
    assert "test kernel not used: not on this machine" in caplog.text


def test_an_undeclared_switch_is_an_error_not_silently_on():
    kernel = cpu_build.CKernel("cpu_argmax.c", "PAGEDSERVE_CPU_TYPO", "typo", ())
    with pytest.raises(KeyError, match="PAGEDSERVE_CPU_TYPO"):
        kernel.loader()()


def test_a_force_included_file_is_part_of_the_build(tmp_path):
    """A library built with `-include FILE` is built again when FILE changes (the emulated AMX
    tiles of the tests come in that way), not taken from the cache."""
    source, header = tmp_path / "answer.c", tmp_path / "value.h"
    source.write_text("int answer(void) { return VALUE; }\n")
    flags = ("-include", str(header))
    built = {}
    for value in (41, 42):
        header.write_text(f"#define VALUE {value}\n")
        path = cpu_build.build(source, tmp_path / "cache", flags)
        built[value] = ctypes.CDLL(str(path)).answer()
    assert built == {41: 41, 42: 42}
