"""What a benchmark result must say about the machine it came from: the CPU model, its ISA
flags that matter for our kernels, the ISA caps set for the run, the kernel capability torch
picked, and the load.

An AVX2-only machine is emulated on a newer one with three caps, one per library that picks
its kernels at run time: ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN: bf16 and packed linears),
ATEN_CPU_CAPABILITY=avx2 (torch's own vectorized ops) and MKL_ENABLE_INSTRUCTIONS=AVX2 (MKL,
which runs every float32 linear: without this cap they still use AVX-512)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")
ISA_ENV = (
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The `flags` of the first processor in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_model(cpuinfo: str) -> str:
    """The first processor's model name, with its family and model numbers where cpuinfo has
    them: a VM may name only the vendor line ("AMD EPYC"), and family 25 (Zen 4, 512-bit
    operations split in two) and 26 (Zen 5, full-width) differ twofold in AVX-512 rate."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def torch_cpu_capability() -> str | None:
    """The vector ISA torch dispatches its CPU kernels to (honours ATEN_CPU_CAPABILITY)."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError):
        return None


def cpu_ticks() -> tuple[int, int]:
    """(all, stolen) CPU ticks since boot from /proc/stat's first line; (0, 0) where it does
    not exist. Steal is time the hypervisor gave our virtual CPUs' turn to another guest."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of the CPU time between two `cpu_ticks()` that the hypervisor stole: on a
    VM, a run with much steal ran on a slower machine than one without."""
    total = after[0] - before[0]
    return (after[1] - before[1]) / total if total > 0 else None


def machine_info() -> dict[str, Any]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    flags = cpu_flags(cpuinfo)
    return {
        "cpu": cpu_model(cpuinfo),
        "num_cpus": len(os.sched_getaffinity(0)),
        "isa_flags": [f for f in ISA_FLAGS if f in flags],
        "isa_env": {k: os.environ[k] for k in ISA_ENV if k in os.environ},
        "torch_cpu_capability": torch_cpu_capability(),
        "loadavg": list(os.getloadavg()),
    }
