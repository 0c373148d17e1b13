"""Building the CPU kernels (`kernels/*.c`) with the machine's C compiler, on first use.

`cc -O3 -fopenmp -shared` with the vector ISA torch itself runs at
(`torch.backends.cpu.get_cpu_capability()`, which `ATEN_CPU_CAPABILITY` caps, so a machine
told to behave as AVX2-only gets AVX2 code here too). A library is cached in
`$PAGEDSERVE_CACHE/kernels` (default `~/.cache/pagedserve/kernels`), named by its source's
name and a hash of the source, the headers beside it (`cpu_bf16.h`), the flags and the
compiler, and written atomically, so
concurrent workers share one build. Its OpenMP runtime is torch's own (the same
`libgomp.so.1`, already loaded), so a kernel runs on torch's thread pool and thread count.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from pagedserve.shared import model_files

logger = logging.getLogger(__name__)

_ISA_FLAGS = {
    "AVX512": ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"),
    "AVX2": ("-mavx2", "-mfma"),
}


class KernelBuildError(RuntimeError):
    """The C compiler is missing or failed."""


def compile_flags() -> list[str]:
    isa = _ISA_FLAGS.get(str(torch.backends.cpu.get_cpu_capability()), ())
    return ["-O3", "-fopenmp", "-fPIC", "-shared", *isa]


def find_compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise KernelBuildError("no C compiler found (set CC, or install gcc)")
    return compiler


def build(source: Path, directory: Path | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """The compiled library of `source`, compiling it if this source, flags and compiler have
    no build in `directory` yet. Raises `KernelBuildError`."""
    compiler = find_compiler()
    flags = [*compile_flags(), *extra_flags]
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelBuildError(f"C compiler {compiler!r} does not run: {exc}") from exc
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(
        source.read_bytes() + headers + " ".join(flags).encode() + version.encode()
    )
    directory = directory or model_files.cache_dir() / "kernels"
    target = directory / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", partial, str(source), "-lm"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise KernelBuildError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: a concurrent build writes the same bytes
    finally:
        Path(partial).unlink(missing_ok=True)
    return target


def load_library(source: Path, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL, Path]:
    """`source` built (or its cached build) and loaded. Raises `KernelBuildError` or
    `OSError`."""
    path = build(source, extra_flags=extra_flags)
    return ctypes.CDLL(str(path)), path


def switched_off(variable: str) -> bool:
    """True where the environment turns a kernel off (`variable` set to 0, false or no)."""
    return os.environ.get(variable, "1").lower() in ("0", "false", "no")


def load_kernel(
    source: Path, switch: str, what: str, extra_flags: tuple[str, ...] = ()
) -> ctypes.CDLL | None:
    """`source`'s library, or None when `switch` turns it off or it cannot be built; either is
    logged, saying `what` falls back."""
    if switched_off(switch):
        logger.info("%s turned off (%s=0)", what, switch)
        return None
    try:
        library, path = load_library(source, extra_flags)
    except (KernelBuildError, OSError) as exc:
        logger.warning("%s unavailable, using torch ops: %s", what, exc)
        return None
    logger.info("%s loaded from %s", what, path)
    return library
