"""The default model's tokenizer, once per test session, offline: read from its GGUF the first
time, then from the copy `load_tokenizer` keeps in the pagedserve cache."""

from __future__ import annotations

from functools import cache

from pagedserve.services.gateway.tokenizer import TokenizerInfo, load_tokenizer

TEST_MAX_MODEL_LEN = 256


@cache
def load_test_tokenizer() -> TokenizerInfo:
    return load_tokenizer("smollm2", TEST_MAX_MODEL_LEN)
