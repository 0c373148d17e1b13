"""Build a model from a Hugging Face directory: config.json plus safetensors (one file or
shards listed by model.safetensors.index.json), loaded tensor by tensor with a progress bar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm
from transformers import AutoConfig, PretrainedConfig

from pagedserve.services.gpu_worker.attention.base import BaseAttentionBackend
from pagedserve.services.gpu_worker.models import get_model_cls
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.parallel_state import get_tp_world_size
from pagedserve.services.gpu_worker.platforms import get_platform

SAFETENSORS_INDEX = "model.safetensors.index.json"
# kept as stored whatever the model's dtype (DeepSeek-V3's router bias steers a choice that a
# bf16 rounding of it can change; the model holds it in float32)
FLOAT32_WEIGHTS = ("e_score_correction_bias",)


def load_config(model_dir: Path) -> PretrainedConfig:
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json")
    return AutoConfig.from_pretrained(model_dir)


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({model_dir / name for name in weight_map.values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors weights")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{SAFETENSORS_INDEX} names missing shard(s): {missing}")
    return files


def iterate_weights(
    files: list[Path], dtype: torch.dtype, show_progress: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    for path in tqdm(files, desc="loading weights", unit="file", disable=not show_progress):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensor = handle.get_tensor(name)
                yield name, tensor if name.endswith(FLOAT32_WEIGHTS) else tensor.to(dtype)


def load_model(
    model_dir: Path,
    backend_cls: type[BaseAttentionBackend],
    dtype: torch.dtype,
    device: torch.device,
    show_progress: bool = True,
) -> BaseCausalLM:
    """The model with every weight loaded and prepared for `device`'s platform (the CPU packs
    its linears); a missing or unknown weight is an error naming it."""
    config = load_config(model_dir)
    model_cls = get_model_cls(
        list(getattr(config, "architectures", None) or []), getattr(config, "model_type", "")
    )
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(config, backend_cls)
    finally:
        torch.set_default_dtype(default_dtype)
    loaded = model.load_weights(iterate_weights(safetensors_files(model_dir), dtype, show_progress))
    missing = sorted(model.expected_weights() - loaded)
    if missing:
        raise ValueError(f"{model_dir}: checkpoint is missing weight(s) {missing[:8]}")
    get_platform(device).prepare_model(model, get_tp_world_size())
    return model.eval()
