"""The gateway's routes: the OpenAI API, /health and /metrics, wired to the engine client.

Streaming waits for the request's first delta before sending headers, so that an engine error
(queue full, invalid request, engine failure) still gets its HTTP status; after that, an error
is a final `data: {"error": ...}` event. A client that goes away (while waiting or streaming)
has its request aborted upstream at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from pagedserve.services.gateway.admission import admit_chat, admit_completion
from pagedserve.services.gateway.auto_tools import AutoTools
from pagedserve.services.gateway.client_limits import client_limit_middleware
from pagedserve.services.gateway.completion_session import CompletionSession
from pagedserve.services.gateway.drain import Drainer, DrainMiddleware
from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.errors import APIError, bad_request
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.services.gateway.grammar_validator import GrammarValidator
from pagedserve.services.gateway.http_middleware import GatewayMiddleware
from pagedserve.services.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from pagedserve.services.gateway.openai_schema import (
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)
from pagedserve.services.gateway.openapi_document import openapi_document
from pagedserve.services.gateway.output_modes import PLAIN_TEXT
from pagedserve.services.gateway.output_processor import ChoiceProcessor
from pagedserve.services.gateway.request_builder import (
    PromptInput,
    check_lengths,
    engine_requests,
    tokenize_chat,
    tokenize_completion,
)
from pagedserve.services.gateway.response_formatter import PromptView, ResponseFormatter
from pagedserve.services.gateway.sse import SSE_DONE, SSE_MEDIA_TYPE, sse_event
from pagedserve.services.gateway.tokenize_routes import TokenizeRoutes
from pagedserve.services.gateway.tokenizer import TokenizerInfo
from pagedserve.services.gateway.tokenizer_pool import TokenizerPool

logger = logging.getLogger(__name__)
T = TypeVar("T")
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request"; nobody reads it


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class AbortingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always watches for the client leaving (newer Starlette only
    notices when a write fails, which never happens while we wait for the next token) and
    always closes its body iterator, whose `finally` aborts the request upstream."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, raising ClientGone (and cancelling it) if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON; 413 past `limit` bytes (checked while reading), 400 if not UTF-8 JSON."""
    declared = request.headers.get("content-length", "")
    too_large = APIError(
        413, f"request body too large: the limit is {limit} bytes", code="body_too_large"
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    raw = bytearray()  # one growing buffer, freed before parsing: a big body is held twice
    async for chunk in request.stream():  # at most (bytes, then text), never four times
        if len(raw) + len(chunk) > limit:
            raise too_large
        raw += chunk
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8 (byte {exc.start})") from exc
    del raw
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # e.g. "[[[[...": the parser recurses once per level
        raise bad_request("the request body is nested too deeply") from exc
    if _SURROGATE_ESCAPE.search(text):  # rare: only then pay for a full re-encode
        _reject_lone_surrogates(body)
    return body


# A JSON \u escape of a UTF-16 surrogate; a lone one decodes to a str that is not valid
# Unicode, which the tokenizer (and any UTF-8 writer) would fail on later.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _reject_lone_surrogates(body: Any) -> None:
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(
            "the request body holds an unpaired UTF-16 surrogate escape (e.g. \\ud800), "
            "which is not a Unicode character"
        ) from exc


class GatewayRoutes:
    """The handlers, sharing the config, tokenizer, engine client and metrics."""

    def __init__(self, config: GatewayConfig, info: TokenizerInfo, client: EngineClient) -> None:
        self.config = config
        self.info = info
        self.client = client
        self.metrics = GatewayMetrics(config.model_name, info.max_model_len, client.router.stats)
        self.tokenizer_pool = TokenizerPool(config.tokenizer_threads)
        self.created = int(time.time())
        self.grammars = GrammarValidator()
        self.auto_tools = AutoTools.of(config, info)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.model_name, self.config.model):
            raise APIError(
                404,
                f"the model `{model}` does not exist; this server serves "
                f"`{self.config.model_name}`",
                param="model",
                code="model_not_found",
            )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "pagedserve",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.info.max_model_len,
            "permission": [  # vLLM's card lists one permission object, open to all
                {
                    "id": f"modelperm-{self.config.model_name}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: the client's `models.retrieve`."""
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._model_card())

    async def completions(self, request: Request) -> Response:
        parsed = parse_completion_request(await read_json(request, self.config.max_body_bytes))
        self._check_model(parsed.model)
        admit_completion(parsed, self.info, self.config.max_seqs_per_request)
        prompts = await self.tokenizer_pool.run(tokenize_completion, parsed, self.info)
        check_lengths(prompts, parsed.sampling, self.info.max_model_len, "max_tokens")
        return await self._generate(request, "completion", parsed, prompts)

    async def chat(self, request: Request) -> Response:
        parsed = parse_chat_request(await read_json(request, self.config.max_body_bytes))
        self._check_model(parsed.model)
        admit_chat(parsed, self.config.max_seqs_per_request)
        self.auto_tools.check(parsed)
        trusted = self.config.trust_request_chat_template
        prompts = await self.tokenizer_pool.run(tokenize_chat, parsed, self.info, trusted)
        max_len = self.info.max_model_len
        check_lengths(prompts, parsed.sampling, max_len, parsed.max_tokens_param, "messages")
        return await self._generate(request, "chat", parsed, prompts)

    async def _generate(
        self,
        request: Request,
        kind: str,
        parsed: CompletionRequest | ChatRequest,
        prompts: list[PromptInput],
    ) -> Response:
        options = parsed.sampling
        await self.grammars.check(options.structured)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        requests = engine_requests(response_id, prompts, options, self.info, self.client.gateway_id)
        want_logprobs = options.logprobs is not None
        output = parsed.output
        processors = [
            ChoiceProcessor(self.info, options.stop, want_logprobs,
                            skip_special_tokens=output.skip_special_tokens,
                            include_stop_str_in_output=output.include_stop_str_in_output,
                            stop_token_ids=options.stop_token_ids, min_tokens=options.min_tokens,
                            tokens_as_ids=output.return_tokens_as_token_ids)
            for _ in requests
        ]  # fmt: skip
        session = CompletionSession(self.client, self.metrics, requests, processors, options.n)
        formatter = ResponseFormatter(
            kind, response_id, parsed.model or self.config.model_name, int(time.time()),
            want_logprobs, self.info, output, prompt_views(parsed, prompts, self.info),
            options.n, options.logprobs or 0,
            mode=parsed.mode if isinstance(parsed, ChatRequest) else PLAIN_TEXT,
            on_tool_parse=self.metrics.requests.tool_parser_invoked,
        )  # fmt: skip
        await session.submit()
        try:
            await until_disconnect(request, session.wait_first())
            if parsed.stream:
                events = self._events(session, formatter, parsed.include_usage)
                return AbortingStreamingResponse(events, media_type=SSE_MEDIA_TYPE)
            await until_disconnect(request, _collect(session))
        except ClientGone:
            await session.close("client disconnected")
            return Response(status_code=CLIENT_CLOSED_STATUS)
        except BaseException:
            await session.close()
            raise
        await session.close()
        return JSONResponse(formatter.full(session.processors, session.logprobs, session.usage()))

    async def _events(
        self, session: CompletionSession, formatter: ResponseFormatter, include_usage: bool
    ) -> AsyncIterator[bytes]:
        try:
            if formatter.kind == "chat":
                for index in range(len(session.processors)):
                    yield sse_event(formatter.role_chunk(index))
            while not session.finished:
                for index, update in await session.receive():
                    chunk = formatter.chunk(index, update, session.processors[index])
                    if chunk is not None:
                        yield sse_event(chunk)
            if include_usage:
                yield sse_event(formatter.usage_chunk(session.usage()))
        except APIError as exc:
            yield sse_event(exc.body())
        finally:
            with anyio.CancelScope(shield=True):
                await session.close("client disconnected")
        yield SSE_DONE

    async def health(self, request: Request) -> Response:
        try:
            statuses = (await self.client.status_view.current()).statuses
        except RedisError as exc:
            reason = f"the request queue (Redis) is unreachable: {exc}"
            return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
        now = time.time()
        live = [s.engine_id for s in statuses if self.client.is_live(s, now)]
        if live:
            return JSONResponse({"status": "ok", "engines": live})
        if not statuses:
            reason = "no engine has registered"
        else:
            reason = "no engine is live: " + "; ".join(
                f"{s.engine_id}: status {now - s.time:.1f}s old, workers_alive={s.workers_alive}"
                for s in statuses
            )
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(f"pagedserve gateway ({self.config.model_name})"))

    async def metrics_text(self, request: Request) -> Response:
        try:
            snapshot = await self.client.status_view.current()
            statuses, restarts = snapshot.statuses, snapshot.process_restarts
        except RedisError:
            statuses, restarts = [], {}
        now = time.time()
        live = [s for s in statuses if self.client.is_live(s, now)]
        return Response(self.metrics.render(live, restarts), media_type=CONTENT_TYPE)


def prompt_views(
    parsed: CompletionRequest | ChatRequest, prompts: list[PromptInput], info: TokenizerInfo
) -> list[PromptView]:
    """Each prompt's ids and, with `echo`, the text to repeat: a completion prompt as sent
    (decoded when sent as ids or truncated); for chat, the last message when it is the
    assistant's (vLLM)."""
    if not parsed.output.echo:
        return [PromptView(p.token_ids) for p in prompts]
    if isinstance(parsed, ChatRequest):
        last = parsed.messages[-1]
        text = last.content if last.role == "assistant" else ""
        return [PromptView(p.token_ids, text) for p in prompts]
    views = []
    for sent, prompt in zip(parsed.prompts, prompts, strict=True):
        as_sent = isinstance(sent, str) and parsed.output.truncate_prompt_tokens is None
        text = sent if as_sent else info.tokenizer.decode(prompt.token_ids)
        views.append(PromptView(prompt.token_ids, text))
    return views


async def _collect(session: CompletionSession) -> None:
    while not session.finished:
        await session.receive()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return APIError(exc.status_code, str(exc.detail), code=code).response()


def build_app(
    config: GatewayConfig,
    info: TokenizerInfo,
    client: EngineClient,
    drainer: Drainer | None = None,
) -> Starlette:
    """The ASGI app. The engine client starts and stops with the app's lifespan; with a
    `drainer`, requests are refused with 503 once it starts draining."""
    routes = GatewayRoutes(config, info, client)
    tokenize_routes = TokenizeRoutes(
        info,
        lambda request: read_json(request, config.max_body_bytes),
        routes._check_model,
        config.trust_request_chat_template,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.start()
        try:
            yield
        finally:
            await client.close()
            routes.tokenizer_pool.close()

    app = Starlette(
        routes=[
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", routes.model, methods=["GET"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/ping", routes.health, methods=["GET", "POST"]),  # vLLM's (SageMaker's)
            Route("/metrics", routes.metrics_text, methods=["GET"]),
            Route("/openapi.json", routes.openapi, methods=["GET"]),
            Route("/tokenize", tokenize_routes.tokenize, methods=["POST"]),
            Route("/detokenize", tokenize_routes.detokenize, methods=["POST"]),
            Route("/version", tokenize_routes.version, methods=["GET"]),
        ],
        middleware=[
            *([Middleware(DrainMiddleware, drainer=drainer)] if drainer else []),
            Middleware(
                GatewayMiddleware,
                api_key=config.api_key,
                metrics_require_key=config.metrics_require_key,
                gateway_id=client.gateway_id,
            ),
            *client_limit_middleware(config),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.routes = routes
    return app
