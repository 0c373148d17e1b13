"""One rule for a model's end tokens and length limit, read from its directory's files; the
gateway, the worker and the engine all get the same answer from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedserve.shared.model_facts import length_limit, read_model_facts


def write_model(path: Path, **files: dict) -> Path:
    for name, content in files.items():
        (path / f"{name}.json").write_text(json.dumps(content))
    return path


def test_end_tokens_that_differ_between_files_are_all_kept(tmp_path: Path) -> None:
    model = write_model(
        tmp_path,
        config={"max_position_embeddings": 2048, "eos_token_id": 2, "vocab_size": 100},
        generation_config={"eos_token_id": [7, 2]},
        tokenizer_config={"eos_token": {"content": "<|im_end|>"}, "chat_template": "{{ x }}"},
        tokenizer={"added_tokens": [{"id": 9, "content": "<|im_end|>"}], "model": {}},
    )
    facts = read_model_facts(model)
    assert facts.eos_token_ids == (7, 2, 9)  # generation_config, config, tokenizer
    assert facts.max_model_len == 2048 and facts.vocab_size == 100
    assert facts.has_chat_template


def test_the_tokenizers_end_token_from_its_vocabulary(tmp_path: Path) -> None:
    model = write_model(
        tmp_path,
        config={"max_position_embeddings": 64},
        tokenizer_config={"eos_token": "</s>"},
        tokenizer={"added_tokens": [], "model": {"vocab": {"<s>": 1, "</s>": 3}}},
    )
    facts = read_model_facts(model)
    assert facts.eos_token_ids == (3,)
    assert not facts.has_chat_template and facts.vocab_size is None


def test_an_empty_directory_has_no_facts(tmp_path: Path) -> None:
    facts = read_model_facts(tmp_path)
    assert facts.eos_token_ids == () and facts.max_model_len is None


POSITIONS = {"max_position_embeddings": 32768}


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({**POSITIONS, "sliding_window": 4096, "model_type": "mistral"}, 32768),
        ({**POSITIONS, "sliding_window": 4096, "use_sliding_window": True}, 32768),
        ({**POSITIONS, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 65536),
        ({"max_position_embeddings": 8192, "model_type": "llama"}, 8192),
        ({"model_type": "llama"}, None),
    ],
)  # fmt: skip
def test_length_limit_is_the_positions_whatever_the_window(config: dict, limit: int | None) -> None:
    assert length_limit(config) == limit


def test_gateway_and_worker_agree_on_a_sliding_window_model(tmp_path: Path) -> None:
    """Without --max-model-len, the gateway's default max_tokens fills the context the worker
    (and so the scheduler) allows: the positions, not the window (attention slides)."""
    from transformers import MistralConfig

    from pagedserve.services.gateway.tokenizer import tokenizer_info
    from pagedserve.services.gpu_worker.model_runner import model_len_limit
    from tests.unit.gateway.helpers import load_test_tokenizer

    config = MistralConfig(max_position_embeddings=32768, sliding_window=4096)
    config.save_pretrained(tmp_path)
    gateway = tokenizer_info(load_test_tokenizer().tokenizer, tmp_path)
    assert gateway.max_model_len == model_len_limit(config) == 32768
    assert read_model_facts(tmp_path).eos_token_ids == gateway.eos_token_ids == (2,)
