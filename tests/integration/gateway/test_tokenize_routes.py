"""vLLM's /tokenize, /detokenize and /version, in vLLM's shapes (httpx: the openai client has
no such calls)."""

from __future__ import annotations

import pytest

from tests.integration.gateway.conftest import MODEL_NAME

pytestmark = pytest.mark.integration


def test_tokenize_a_prompt_and_back(gateway, info):
    with gateway.client() as c:
        body = {"model": MODEL_NAME, "prompt": "Hello, world", "return_token_strs": True}
        answer = c.post("/tokenize", json=body).json()
        ids = info.tokenizer.encode("Hello, world")
        assert answer == {
            "count": len(ids), "max_model_len": info.max_model_len, "tokens": ids,
            "token_strs": info.tokenizer.convert_ids_to_tokens(ids),
        }  # fmt: skip
        back = c.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json()
        assert back == {"prompt": "Hello, world"}


def test_tokenize_messages_with_the_chat_template(gateway, info):
    messages = [{"role": "user", "content": "hi"}]
    with gateway.client() as c:
        answer = c.post("/tokenize", json={"messages": messages}).json()
        plain = c.post(
            "/tokenize", json={"messages": messages, "add_generation_prompt": False}
        ).json()
    text = info.tokenizer.decode(answer["tokens"])
    assert text.endswith("<|im_start|>assistant\n") and answer["token_strs"] is None
    assert plain["count"] < answer["count"]


def test_bad_input_is_a_400_naming_the_field(gateway, info):
    with gateway.client() as c:
        r = c.post("/detokenize", json={"tokens": [1, info.vocab_size]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
        r = c.post("/detokenize", json={"tokens": "12"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
        r = c.post("/tokenize", json={"prompt": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = c.post("/tokenize", json={"prompt": "x", "model": "other"})
        assert r.status_code == 404 and r.json()["error"]["reason"] == "model_not_found"


def test_version(gateway):
    with gateway.client() as c:
        version = c.get("/version").json()["version"]
    assert version and version[0].isdigit()
