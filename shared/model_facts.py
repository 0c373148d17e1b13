"""What a model directory says about the model, read one way for every service: its end
tokens, the longest sequence it handles, its vocabulary size, whether it has a chat template.

Stdlib only (the scheduler side has no torch, the gateway no model), from the files Hugging Face
writes: config.json, generation_config.json, tokenizer_config.json, tokenizer.json. The gateway,
the worker and the in-process engine all call `read_model_facts` (or `length_limit` on a config
they already hold), so they cannot disagree on when a sequence ends or how long it may grow.

- End tokens: the union, in this order, of generation_config's `eos_token_id` (what
  `generate()` stops on), config's `eos_token_id`, and the tokenizer's `eos_token`. A model
  whose files disagree (a chat model whose generation_config adds `<|im_end|>`) stops on each.
- Length limit: `max_position_embeddings` (times the factor of dynamic NTK rope scaling, which
  serves past it). A sliding window does not cap it: the worker attends within each layer's
  window.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedserve.shared.value_checks import is_int


@dataclass(frozen=True)
class ModelFacts:
    eos_token_ids: tuple[int, ...]
    max_model_len: int | None  # None: the config states no length
    vocab_size: int | None
    has_chat_template: bool


def read_model_facts(model_dir: Path) -> ModelFacts:
    """The facts of the model in `model_dir` (missing or unreadable files count as empty)."""
    config = _read_json(model_dir / "config.json")
    generation = _read_json(model_dir / "generation_config.json")
    tokenizer_config = _read_json(model_dir / "tokenizer_config.json")
    eos_ids = [*_as_ids(generation.get("eos_token_id")), *_as_ids(config.get("eos_token_id"))]
    eos_ids += _tokenizer_eos_ids(model_dir, tokenizer_config)
    vocab_size = config.get("vocab_size")
    return ModelFacts(
        eos_token_ids=tuple(dict.fromkeys(eos_ids)),
        max_model_len=length_limit(config),
        vocab_size=vocab_size if is_int(vocab_size) else None,
        has_chat_template=_has_chat_template(model_dir, tokenizer_config),
    )


def length_limit(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the model handles (see the module docstring)."""
    limit = config.get("max_position_embeddings")
    if not is_int(limit):
        return None
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "dynamic":
        limit = int(limit * rope.get("factor", 1.0))  # NTK scaling stretches the positions
    return limit


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _as_ids(value: Any) -> list[int]:
    if is_int(value):
        return [value]
    if isinstance(value, list):
        return [v for v in value if is_int(v)]
    return []


def _tokenizer_eos_ids(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> list[int]:
    """The id of tokenizer_config's `eos_token`, looked up in tokenizer.json."""
    eos = tokenizer_config.get("eos_token")
    content = eos.get("content") if isinstance(eos, dict) else eos
    if not isinstance(content, str):
        return []
    tokenizer = _read_json(model_dir / "tokenizer.json")
    for added in tokenizer.get("added_tokens", []):
        if isinstance(added, dict) and added.get("content") == content and is_int(added["id"]):
            return [added["id"]]
    vocab = tokenizer.get("model", {}).get("vocab")
    if isinstance(vocab, dict) and is_int(vocab.get(content)):
        return [vocab[content]]
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
        pieces = [entry[0] if isinstance(entry, list) and entry else None for entry in vocab]
        if content in pieces:
            return [pieces.index(content)]
    return []


def _has_chat_template(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> bool:
    if tokenizer_config.get("chat_template"):
        return True
    return (model_dir / "chat_template.jinja").is_file() or (
        model_dir / "chat_template.json"
    ).is_file()
