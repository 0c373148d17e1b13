"""The machine record every result carries: CPU model, ISA flags, caps set for the run."""

from __future__ import annotations

import pytest

from benchmarks.machine_info import cpu_flags, cpu_model, machine_info

CPUINFO = """processor\t: 0
model name\t: Some CPU @ 2.0GHz
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16

processor\t: 1
flags\t\t: fpu
"""


def test_flags_and_model_come_from_the_first_processor() -> None:
    assert cpu_flags(CPUINFO) == {"fpu", "sse2", "avx2", "fma", "avx512f", "avx512_bf16"}
    assert cpu_model(CPUINFO) == "Some CPU @ 2.0GHz"
    assert cpu_flags("") == set()


def test_the_model_carries_family_and_model_numbers_where_given() -> None:
    cpuinfo = "processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\n"
    assert cpu_model(cpuinfo) == "AMD EPYC (family 26, model 2)"


def test_the_record_names_the_isa_caps_set_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    info = machine_info()
    assert info["isa_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert info["num_cpus"] >= 1 and len(info["loadavg"]) == 3
    assert set(info["isa_flags"]) <= {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                      "amx_tile", "avx512_vnni"}  # fmt: skip


def test_steal_share_is_the_stolen_part_of_the_ticks_between_two_readings() -> None:
    from benchmarks.machine_info import cpu_ticks, steal_share

    assert steal_share((1000, 10), (1400, 110)) == 0.25
    assert steal_share((1000, 10), (1000, 10)) is None  # no time passed
    total, stolen = cpu_ticks()
    assert 0 <= stolen <= total
