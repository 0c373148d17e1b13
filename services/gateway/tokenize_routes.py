"""vLLM's utility routes: `POST /tokenize`, `POST /detokenize` and `GET /version`, in vLLM's
shapes.

    /tokenize   {"prompt": str, "add_special_tokens": true, "return_token_strs": false}
             or {"messages": [...], "add_generation_prompt": true, ...}  (chat template)
             -> {"count", "max_model_len", "tokens", "token_strs"}
    /detokenize {"tokens": [int]} -> {"prompt": str}
    /version    -> {"version": str}
"""

from __future__ import annotations

import asyncio
from importlib import metadata
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.openai_schema import parse_chat_request
from pagedserve.services.gateway.request_builder import tokenize_chat
from pagedserve.services.gateway.request_fields import BoolField
from pagedserve.services.gateway.tokenizer import TokenizerInfo


def package_version() -> str:
    try:
        return metadata.version("pagedserve")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0.0.0+source"


def _tokenize_body(body: Any, info: TokenizerInfo, trust_template: bool) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    if "messages" in body:
        chat = parse_chat_request(body)
        token_ids = tokenize_chat(chat, info, trust_template)[0].token_ids
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("`prompt` must be a string (or send `messages`)", "prompt")
        add_special = BoolField("add_special_tokens", True).read(body)
        token_ids = info.tokenizer.encode(prompt, add_special_tokens=add_special)
    token_strs = None
    if BoolField("return_token_strs").read(body):
        token_strs = info.tokenizer.convert_ids_to_tokens(token_ids)
    return {
        "count": len(token_ids),
        "max_model_len": info.max_model_len,
        "tokens": token_ids,
        "token_strs": token_strs,
    }


def _detokenize_body(body: Any, info: TokenizerInfo) -> dict[str, Any]:
    tokens = body.get("tokens") if isinstance(body, dict) else None
    is_ids = isinstance(tokens, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    )
    if not is_ids:
        raise bad_request("`tokens` must be an array of token ids", "tokens")
    bad = next((t for t in tokens if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise bad_request(f"`tokens` holds {bad}, outside [0, {info.vocab_size})", "tokens")
    return {"prompt": info.tokenizer.decode(tokens)}


class TokenizeRoutes:
    """Handlers sharing the gateway's tokenizer; `read_json` and `check_model` are the
    gateway's own (body size limit, model name), and so is `trust_template`
    (`--trust-request-chat-template`: whether a request's own `chat_template` is rendered)."""

    def __init__(
        self, info: TokenizerInfo, read_json: Any, check_model: Any, trust_template: bool
    ) -> None:
        self.info = info
        self.read_json = read_json
        self.check_model = check_model
        self.trust_template = trust_template

    async def _body(self, request: Request) -> Any:
        body = await self.read_json(request)
        if isinstance(body, dict):
            model = body.get("model")
            self.check_model(model if isinstance(model, str) else None)
        return body

    async def tokenize(self, request: Request) -> Response:
        body = await self._body(request)
        tokenized = await asyncio.to_thread(_tokenize_body, body, self.info, self.trust_template)
        return JSONResponse(tokenized)

    async def detokenize(self, request: Request) -> Response:
        body = await self._body(request)
        return JSONResponse(await asyncio.to_thread(_detokenize_body, body, self.info))

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": package_version()})
