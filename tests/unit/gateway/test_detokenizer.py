from __future__ import annotations

import copy

from pagedserve.services.gateway.detokenizer import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    direct_decode,
)

TEXTS = [
    "Hello, world!",
    "Ça va? 你好, 世界 — naïve café 🙂🚀 done",
    "emoji only 👩‍👩‍👧‍👦",
    "  leading and   inner spaces\nnew line\ttab",
]


def stream(info, token_ids, step=1):
    detok = IncrementalDetokenizer(info.tokenizer)
    pieces = []
    for i in range(0, len(token_ids), step):
        pieces.append(detok.add(token_ids[i : i + step]))
    pieces.append(detok.finish())
    return pieces


def test_one_token_at_a_time_equals_full_decode(info):
    for text in TEXTS:
        ids = info.tokenizer.encode(text, add_special_tokens=False)
        pieces = stream(info, ids)
        assert "".join(pieces) == info.tokenizer.decode(ids, skip_special_tokens=True) == text
        assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_multibyte_characters_split_across_tokens_are_held_back(info):
    ids = info.tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1, "the test needs a character that spans tokens"
    detok = IncrementalDetokenizer(info.tokenizer)
    assert [detok.add([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add([ids[-1]]) == "🙂"
    assert detok.finish() == ""


def test_chunks_of_several_tokens(info):
    ids = info.tokenizer.encode(TEXTS[1], add_special_tokens=False)
    assert "".join(stream(info, ids, step=3)) == TEXTS[1]


def test_special_tokens_are_skipped(info):
    tok = info.tokenizer
    start = tok.convert_tokens_to_ids("<|im_start|>")
    ids = [start, *tok.encode("hi there", add_special_tokens=False), tok.eos_token_id]
    pieces = stream(info, ids)
    assert "".join(pieces) == "hi there" == tok.decode(ids, skip_special_tokens=True)


def test_a_truncated_character_is_flushed_at_the_end(info):
    ids = info.tokenizer.encode("ok 🙂", add_special_tokens=False)[:-1]  # cut mid-character
    pieces = stream(info, ids)
    assert "".join(pieces) == info.tokenizer.decode(ids, skip_special_tokens=True)
    assert REPLACEMENT_CHAR not in "".join(pieces[:-1])  # only the final flush may hold one


def test_a_run_of_special_tokens_keeps_the_window_short(info):
    detok = IncrementalDetokenizer(info.tokenizer)
    assert detok.add(info.tokenizer.encode("a b", add_special_tokens=False)) == "a b"
    for _ in range(50):
        assert detok.add([info.tokenizer.eos_token_id]) == ""
    assert detok.read_offset - detok.prefix_offset <= 1
    assert detok.add(info.tokenizer.encode(" c", add_special_tokens=False)) == " c"
    assert detok.finish() == "" and detok.emitted_text == "a b c"


def test_the_rust_decode_is_called_directly_only_where_it_says_the_same(info):
    tok = info.tokenizer
    direct = direct_decode(tok)
    assert direct == tok.backend_tokenizer.decode  # SmolLM2's: the stock fast tokenizer
    ids = tok.encode(TEXTS[1] + "<|im_end|> and on", add_special_tokens=False)
    for skip in (True, False):
        assert direct(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    cleaning = copy.copy(tok)
    cleaning.clean_up_tokenization_spaces = True  # Python post-processing: through decode
    assert direct_decode(cleaning) == cleaning.decode

    class Custom(type(tok)):
        def _decode(self, *args, **kwargs):
            return "custom"

    custom = copy.copy(tok)
    custom.__class__ = Custom  # a tokenizer class with a decode of its own: through it
    assert direct_decode(custom)(ids) == "custom"
