"""The default model's tokenizer, loaded from its GGUF once per test session (offline)."""

from __future__ import annotations

from functools import cache

from services.gateway.tokenizer import TokenizerInfo, tokenizer_info

TEST_MAX_MODEL_LEN = 256


@cache
def load_test_tokenizer() -> TokenizerInfo:
    from transformers import AutoTokenizer

    from shared.model_files import default_model_gguf

    gguf = default_model_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return tokenizer_info(tokenizer, None, TEST_MAX_MODEL_LEN)
