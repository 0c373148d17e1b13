"""The C kernels of the CPU (`kernels/*.c`): declared, built with the machine's C compiler on
first use, loaded through ctypes and cached; the one loader for all of them.

Each kernel module declares a `CKernel`: its source, the `PAGEDSERVE_CPU_*` switch that turns
it off (declared in `shared/options.py`), any flags or requirements of this machine, and the
C functions it calls. Their ctypes signatures are read from the prototypes in the source, so
the C file is the one place a signature is written. `CKernel.loader()` gives the module its
`load()`: the library with every function typed, or None (turned off, unsupported here, no
compiler, a failed build), the reason logged once, so that callers keep their torch path.

`cc -O3 -fopenmp -shared` with the vector ISA torch itself runs at
(`torch.backends.cpu.get_cpu_capability()`, which `ATEN_CPU_CAPABILITY` caps, so a machine
told to behave as AVX2-only gets AVX2 code here too). A library is cached in
`$PAGEDSERVE_CACHE/kernels` (default `~/.cache/pagedserve/kernels`), named by its source's
name and a hash of the source, the headers beside it (`cpu_bf16.h`) and any a flag
force-includes, the flags and the compiler, and written atomically, so
concurrent workers share one build. Its OpenMP runtime is torch's own (the same
`libgomp.so.1`, already loaded), so a kernel runs on torch's thread pool and thread count.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedserve.shared import model_files
from pagedserve.shared.options import switch_on

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
        source.read_bytes()
        + headers
        + _included(flags)
        + " ".join(flags).encode()
        + version.encode()
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


def _included(flags: list[str]) -> bytes:
    """The files `-include FILE` flags put ahead of the source: part of what is built."""
    return b"".join(
        Path(file).read_bytes() for flag, file in itertools.pairwise(flags) if flag == "-include"
    )


def load_library(source: Path, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL, Path]:
    """`source` built (or its cached build) and loaded. Raises `KernelBuildError` or
    `OSError`."""
    path = build(source, extra_flags=extra_flags)
    return ctypes.CDLL(str(path)), path


# C types of the kernels' prototypes -> ctypes; any pointer is a c_void_p (a data_ptr())
_C_TYPES: dict[str, type | None] = {
    "void": None,
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
}
_QUALIFIERS = {"const", "restrict"}


def _no_flags() -> tuple[str, ...]:
    return ()


def _supported() -> str | None:
    return None


@dataclass(frozen=True)
class CKernel:
    """One C kernel, declared by the module that calls it."""

    source: str  # the C file's name in kernels/
    switch: str  # the PAGEDSERVE_CPU_* variable that turns it off
    what: str  # for the log: "CPU argmax kernel"
    functions: tuple[str, ...]  # the C functions called; prototypes read from `source`
    flags: Callable[[], tuple[str, ...]] = _no_flags  # extra compiler flags on this machine
    unsupported: Callable[[], str | None] = _supported  # why it cannot run here, or None

    @property
    def path(self) -> Path:
        return Path(__file__).with_name(self.source)

    def build(self, directory: Path | None = None) -> Path:
        """The compiled library's path (see `build`). Raises `KernelBuildError`."""
        return build(self.path, directory, self.flags())

    def loader(self) -> Callable[[], ctypes.CDLL | None]:
        """The kernel's `load()`: cached, so built, loaded and logged once (tests may
        `cache_clear()` it after changing the environment)."""
        return functools.cache(self._load)

    def _load(self) -> ctypes.CDLL | None:
        if not switch_on(self.switch):
            logger.info("%s turned off (%s=0)", self.what, self.switch)
            return None
        reason = self.unsupported()
        if reason is not None:
            logger.info("%s not used: %s", self.what, reason)
            return None
        try:
            library, path = load_library(self.path, self.flags())
        except (KernelBuildError, OSError) as exc:
            logger.warning("%s unavailable, using torch ops: %s", self.what, exc)
            return None
        source = self.path.read_text()
        for name in self.functions:
            function = getattr(library, name)
            function.restype, function.argtypes = c_signature(source, name)
        logger.info("%s loaded from %s", self.what, path)
        return library


def c_signature(source: str, name: str) -> tuple[type | None, list[type]]:
    """(restype, argtypes) of function `name` from its first definition in C `source`."""
    match = re.search(
        rf"^([A-Za-z_][\w ]*?)\s*\b{re.escape(name)}\s*\(([^)]*)\)\s*\{{", source, re.MULTILINE
    )
    if match is None:
        raise ValueError(f"no definition of {name}() in the C source")
    restype = _c_type(match.group(1), name)
    params = " ".join(match.group(2).split())
    if params in ("", "void"):
        return restype, []
    return restype, [_c_param_type(p, name) for p in params.split(",")]


def _c_param_type(param: str, function: str) -> type:
    if "*" in param:
        return ctypes.c_void_p
    words = [w for w in param.split() if w not in _QUALIFIERS]
    ctype = _c_type(" ".join(words[:-1]), function)  # the last word is the parameter's name
    if ctype is None:
        raise ValueError(f"{function}(): a void parameter in {param!r}")
    return ctype


def _c_type(text: str, function: str) -> type | None:
    words = " ".join(w for w in text.split() if w not in _QUALIFIERS)
    if words not in _C_TYPES:
        raise ValueError(f"{function}(): C type {words!r} has no ctypes mapping here")
    return _C_TYPES[words]
