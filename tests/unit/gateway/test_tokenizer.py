from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.tokenizer import load_tokenizer, tokenizer_info

TEXT = "Ça va? 你好 <|im_end|>"


@pytest.mark.slow
def test_default_tokenizer_from_gguf_is_cached_and_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    first = load_tokenizer("smollm2")  # from the GGUF (the model is not converted here)
    (saved,) = (tmp_path / "tokenizers").iterdir()
    assert (saved / "tokenizer_config.json").is_file()
    second = load_tokenizer("smollm2", max_model_len=100)  # from the saved copy
    assert first.tokenizer.encode(TEXT) == second.tokenizer.encode(TEXT)
    assert first.tokenizer.chat_template == second.tokenizer.chat_template
    assert first.eos_token_ids == second.eos_token_ids == (2,)
    assert second.max_model_len == 100 and second.vocab_size == 49152


def test_model_directory_facts(tmp_path, info):
    (tmp_path / "config.json").write_text(
        json.dumps({"max_position_embeddings": 4096, "eos_token_id": 9})
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    facts = tokenizer_info(info.tokenizer, tmp_path)
    assert facts.eos_token_ids == (2, 5, 9)
    assert facts.max_model_len == 4096
    assert tokenizer_info(info.tokenizer, tmp_path, max_model_len=64).max_model_len == 64


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a known alias"):
        load_tokenizer(str(tmp_path / "nope"))


def test_token_text_is_cached(info):
    token_id = info.tokenizer.encode("hello", add_special_tokens=False)[0]
    assert info.token_text(token_id) == info.tokenizer.decode([token_id])
    assert token_id in info._token_texts
