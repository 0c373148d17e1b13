"""The gateway's tokenizer: loaded from the model directory, or for the default model before
it has been converted, straight from the GGUF file (about 6 s, offline). Also what the model
says about its end tokens and length."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedserve.services.gateway.token_bound import max_bytes_per_token, vanishing_chars
from pagedserve.shared.model_facts import read_model_facts
from pagedserve.shared.model_files import (
    cache_dir,
    default_model_gguf,
    is_default_alias,
    resolve_model_dir,
)

logger = logging.getLogger(__name__)

FALLBACK_MAX_MODEL_LEN = 2048  # a model that states no length
REPLACEMENT_CHAR = "\ufffd"  # what a lone byte of a multi-byte character decodes to
MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so spans at most 4 tokens


@dataclass(frozen=True)
class TokenizerInfo:
    """A loaded tokenizer and the model facts that the gateway needs from it."""

    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    vocab_size: int
    max_bytes_per_token: int | None = None  # no token is longer (None: no safe bound)
    vanishing_chars: str = ""  # characters the tokenizer drops (not counted by the bound)
    # Logprobs name the same few thousand tokens again and again: decode each once.
    _token_texts: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    def token_text(self, token_id: int) -> str:
        """One token's text, as logprobs show it."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_texts[token_id] = text
        return text

    def token_text_after(self, token_id: int, context_ids: list[int]) -> str:
        """A token's text for logprobs after the tokens `context_ids` (vLLM's rule): its own
        text, unless alone it is part of a multi-byte character (it ends in U+FFFD); then the
        text it completes with up to `MAX_CHAR_TOKENS` tokens before it, or "" while the
        character is still incomplete (its bytes show with the token that completes it)."""
        text = self.token_text(token_id)
        if not text.endswith(REPLACEMENT_CHAR):
            return text
        context = context_ids[-MAX_CHAR_TOKENS:]
        for size in range(1, len(context) + 1):
            tail = context[-size:]
            whole = self.tokenizer.decode([*tail, token_id], skip_special_tokens=False)
            if whole.endswith(REPLACEMENT_CHAR):
                continue
            # the tail tokens that are incomplete alone belong to this character
            clean = len(tail)
            while clean and self.token_text(tail[clean - 1]).endswith(REPLACEMENT_CHAR):
                clean -= 1
            prefix = self.tokenizer.decode(tail[:clean], skip_special_tokens=False)
            shared = next(
                (i for i, (a, b) in enumerate(zip(prefix, whole, strict=False)) if a != b),
                min(len(prefix), len(whole)),
            )  # the prefix's text, even where decoding normalized it differently
            return whole[shared:]
        return ""


def _model_facts(model_dir: Path | None, tokenizer: Any) -> tuple[tuple[int, ...], int | None]:
    """End tokens and length limit by the one rule every service uses (`shared.model_facts`);
    without a model directory (the default model before its conversion), the tokenizer's."""
    if model_dir is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        return ((eos,) if isinstance(eos, int) else ()), None
    facts = read_model_facts(model_dir)
    return facts.eos_token_ids, facts.max_model_len


def load_tokenizer(model: str, max_model_len: int | None = None) -> TokenizerInfo:
    """The tokenizer for `model` (an alias or a model directory)."""
    from transformers import AutoTokenizer  # heavy import, only where a tokenizer is loaded

    model_dir = resolve_model_dir(model)
    if model_dir.is_dir() and (model_dir / "config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        source: Path | None = model_dir
    elif is_default_alias(model):
        tokenizer = _default_tokenizer_from_gguf()
        source = None
    else:  # resolve_model_dir already raised for anything else
        raise FileNotFoundError(model_dir)
    return tokenizer_info(tokenizer, source, max_model_len)


def _default_tokenizer_from_gguf() -> Any:
    """The default model's tokenizer before its conversion: read from the GGUF once (about
    6 s), then from a saved copy in the cache (well under a second)."""
    from transformers import AutoTokenizer

    gguf = default_model_gguf()
    stat = gguf.stat()
    saved = cache_dir() / "tokenizers" / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    if (saved / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(saved))
    logger.info("loading the tokenizer from %s (the model is not converted yet)", gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _save_tokenizer(tokenizer, saved)
    return tokenizer


def _save_tokenizer(tokenizer: Any, saved: Path) -> None:
    """Write beside, then rename, so that a concurrent reader never sees half a directory."""
    staging: Path | None = None
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=saved.parent, prefix=".staging-"))
        tokenizer.save_pretrained(str(staging))
        staging.rename(saved)
    except OSError as exc:  # a read-only cache, or another process won: only costs time
        if not saved.is_dir():
            logger.warning("could not cache the tokenizer in %s: %s", saved, exc)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def tokenizer_info(
    tokenizer: Any, model_dir: Path | None = None, max_model_len: int | None = None
) -> TokenizerInfo:
    """Wrap an already loaded tokenizer (tests, or a caller that loaded it itself)."""
    eos_ids, model_len = _model_facts(model_dir, tokenizer)
    if max_model_len is None:
        max_model_len = model_len or _default_len_of(tokenizer)
    return TokenizerInfo(
        tokenizer=tokenizer,
        eos_token_ids=eos_ids,
        max_model_len=max_model_len,
        vocab_size=len(tokenizer),
        max_bytes_per_token=max_bytes_per_token(tokenizer),
        vanishing_chars=vanishing_chars(tokenizer),
    )


def _default_len_of(tokenizer: Any) -> int:
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < 10_000_000:
        return length
    return FALLBACK_MAX_MODEL_LEN
