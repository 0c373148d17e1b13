"""Model architectures by Hugging Face `architectures` name."""

from __future__ import annotations

from pagedserve.services.gpu_worker.models.llama import LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}


# For configs written without `architectures` (e.g. converted from GGUF).
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def get_model_cls(architectures: list[str], model_type: str = "") -> type[LlamaForCausalLM]:
    names = architectures or [_MODEL_TYPES.get(model_type, f"<model_type {model_type!r}>")]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"unsupported model architecture {names}; supported: {sorted(MODEL_REGISTRY)}")
