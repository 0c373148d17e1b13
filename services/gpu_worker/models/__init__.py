"""Model architectures by Hugging Face `architectures` name, each a `BaseCausalLM`."""

from __future__ import annotations

from pagedserve.services.gpu_worker.models.deepseek_v2 import (
    DeepseekV2ForCausalLM,
    DeepseekV3ForCausalLM,
)
from pagedserve.services.gpu_worker.models.ernie4_5 import Ernie4_5ForCausalLM
from pagedserve.services.gpu_worker.models.exaone4 import Exaone4ForCausalLM
from pagedserve.services.gpu_worker.models.gemma import GemmaForCausalLM
from pagedserve.services.gpu_worker.models.gemma2 import Gemma2ForCausalLM
from pagedserve.services.gpu_worker.models.gemma3 import Gemma3ForCausalLM
from pagedserve.services.gpu_worker.models.gpt_oss import GptOssForCausalLM
from pagedserve.services.gpu_worker.models.granite import GraniteForCausalLM
from pagedserve.services.gpu_worker.models.interface import BaseCausalLM
from pagedserve.services.gpu_worker.models.llama import LlamaForCausalLM
from pagedserve.services.gpu_worker.models.mixtral import MixtralForCausalLM
from pagedserve.services.gpu_worker.models.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from pagedserve.services.gpu_worker.models.phi3 import Phi3ForCausalLM
from pagedserve.services.gpu_worker.models.qwen2_moe import Qwen2MoeForCausalLM
from pagedserve.services.gpu_worker.models.qwen3 import Qwen3ForCausalLM
from pagedserve.services.gpu_worker.models.qwen3_moe import Qwen3MoeForCausalLM
from pagedserve.services.gpu_worker.models.smollm3 import SmolLM3ForCausalLM

MODEL_REGISTRY: dict[str, type[BaseCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "GemmaForCausalLM": GemmaForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}


# For configs written without `architectures` (e.g. converted from GGUF).
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "granite": "GraniteForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}


def get_model_cls(architectures: list[str], model_type: str = "") -> type[BaseCausalLM]:
    names = architectures or [_MODEL_TYPES.get(model_type, f"<model_type {model_type!r}>")]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(f"unsupported model architecture {names}; supported: {sorted(MODEL_REGISTRY)}")
