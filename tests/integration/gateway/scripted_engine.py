"""A stand-in engine for gateway tests: reads the request stream through the `engines`
consumer group and answers with token deltas it chooses, the way the real scheduler would
(OutputBatch entries on the gateway's stream, XACK + XDEL when a request finishes).

What it answers depends on markers in the decoded prompt:
    [error:<code>]  one delta with finish_reason "error" and that error_code
    [error-after:<code>]  two tokens of `reply`, then the error
    [hang]          nothing until aborted (for disconnect tests)
    [eos]           after `reply`, the EOS token as a stop token (not shown, counted)
    anything else   `reply` tokenized, one token per delta, up to max_tokens
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from pagedserve.shared.keys import ENGINE_GROUP, RedisKeys
from pagedserve.shared.protocol import (
    AbortRequest,
    GenerateRequest,
    OutputBatch,
    PromptLogprobs,
    ProtocolError,
    TokenDelta,
    decode,
    encode,
)

DEFAULT_REPLY = "Hello! Ça va? 你好, world."


@dataclass
class ScriptedEngine:
    redis_url: str
    namespace: str
    tokenizer: Any
    reply: str = DEFAULT_REPLY
    token_delay_s: float = 0.005
    received: list[GenerateRequest] = field(default_factory=list)
    aborts: list[tuple[float, AbortRequest]] = field(default_factory=list)
    num_cached_tokens: int = 3

    def __post_init__(self) -> None:
        self.keys = RedisKeys(self.namespace)
        self.redis = redis.Redis.from_url(self.redis_url)
        self._stop = threading.Event()
        self._aborted: set[str] = set()
        self._threads: list[threading.Thread] = []
        with contextlib.suppress(redis.ResponseError):  # the group exists already
            self.redis.xgroup_create(self.keys.requests, ENGINE_GROUP, id="0", mkstream=True)

    def start(self) -> ScriptedEngine:
        for target in (self._serve_requests, self._read_aborts):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(timeout=5)
        self.redis.close()

    def _serve_requests(self) -> None:
        while not self._stop.is_set():
            answer = self.redis.xreadgroup(
                ENGINE_GROUP, "scripted", {self.keys.requests: ">"}, count=16, block=100
            )
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    try:
                        request = decode(fields[b"m"])
                    except (KeyError, ProtocolError):
                        continue  # a filler entry a test put there: leave it queued
                    self.received.append(request)
                    thread = threading.Thread(
                        target=self._answer, args=(entry_id, request), daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)

    def _read_aborts(self) -> None:
        last_id = "0-0"
        while not self._stop.is_set():
            answer = self.redis.xread({self.keys.aborts: last_id}, block=100)
            for _, entries in answer or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    abort = decode(fields[b"m"])
                    self.aborts.append((time.monotonic(), abort))
                    self._aborted.update(abort.request_ids)

    def _send(self, gateway_id: str, delta: TokenDelta) -> None:
        batch = OutputBatch(engine_id="scripted", deltas=[delta])
        self.redis.xadd(self.keys.output(gateway_id), {"m": encode(batch)})

    def _finish(self, entry_id: bytes) -> None:
        self.redis.xack(self.keys.requests, ENGINE_GROUP, entry_id)
        self.redis.xdel(self.keys.requests, entry_id)

    def _answer(self, entry_id: bytes, request: GenerateRequest) -> None:
        # what the real scheduler records on first scheduling (queue/prefill time metrics)
        self.redis.hset(self.keys.request(request.request_id), "scheduled_at", time.time())
        prompt = self.tokenizer.decode(request.prompt_token_ids)
        num_prompt = len(request.prompt_token_ids)
        error = re.search(r"\[error:(\w+)\]", prompt)
        late_error = re.search(r"\[error-after:(\w+)\]", prompt)
        if late_error:
            for token_id in self.tokenizer.encode(self.reply, add_special_tokens=False)[:2]:
                self._send(request.gateway_id, TokenDelta(request.request_id, [token_id]))
            error = late_error
        if error:
            self._send(request.gateway_id, TokenDelta(
                request.request_id, [], finish_reason="error", error=f"scripted {error[1]}",
                error_code=error[1], num_prompt_tokens=num_prompt,
            ))  # fmt: skip
            self._finish(entry_id)
            return
        if "[hang]" in prompt:
            while request.request_id not in self._aborted and not self._stop.is_set():
                time.sleep(0.01)
            self._finish(entry_id)
            return
        self._stream_reply(request, num_prompt)
        self._finish(entry_id)

    def _stream_reply(self, request: GenerateRequest, num_prompt: int) -> None:
        reply_ids = self.tokenizer.encode(self.reply, add_special_tokens=False)
        limit = request.sampling.max_tokens
        ids = reply_ids[:limit]
        prompt_logprobs = scripted_prompt_logprobs(request)
        ends_with_eos = "[eos]" in self.tokenizer.decode(request.prompt_token_ids)
        if limit == 0:  # prompt only: done after the prefill
            self._send(request.gateway_id, TokenDelta(
                request.request_id, [], finish_reason="length", num_prompt_tokens=num_prompt,
                prompt_logprobs=prompt_logprobs,
            ))  # fmt: skip
            return
        k = request.sampling.logprobs
        for i, token_id in enumerate(ids):
            if request.request_id in self._aborted or self._stop.is_set():
                return
            last = i == len(ids) - 1
            reason = None if not last else ("length" if len(reply_ids) > limit else "stop")
            if ends_with_eos and reason == "stop":
                reason = None  # the EOS delta below ends it
            logprobs = top = None
            if k is not None:  # the sampled token first, then made-up alternatives
                logprobs = [-0.5 - i / 10]
                alternatives = [(t, -3.0 - t / 1e5) for t in range(100, 100 + k)]
                top = [[(token_id, logprobs[0]), *alternatives][:k]]
            self._send(request.gateway_id, TokenDelta(
                request.request_id, [token_id], logprobs=logprobs, top_logprobs=top,
                finish_reason=reason, num_prompt_tokens=num_prompt, num_output_tokens=i + 1,
                num_cached_tokens=min(self.num_cached_tokens, num_prompt),
                prompt_logprobs=prompt_logprobs if i == 0 else None,
            ))  # fmt: skip
            time.sleep(self.token_delay_s)
        if ends_with_eos and len(ids) == len(reply_ids):
            logprobs = top = None
            if k is not None:  # the stop token's logprob comes too, as the scheduler sends it
                logprobs, top = [-0.25], [[(SCRIPTED_EOS, -0.25)][:k]]
            self._send(request.gateway_id, TokenDelta(
                request.request_id, [], finish_reason="stop", num_prompt_tokens=num_prompt,
                num_output_tokens=len(ids) + 1, stop_token_id=SCRIPTED_EOS, logprobs=logprobs,
                top_logprobs=top,
            ))  # fmt: skip


SCRIPTED_EOS = 2  # SmolLM2's <|im_end|>


def scripted_prompt_logprobs(request: GenerateRequest) -> PromptLogprobs | None:
    """Made-up prompt logprobs: position i gets -1 - i/10, rank i + 1, and k alternatives."""
    k = request.sampling.prompt_logprobs
    if k is None:
        return None
    num = len(request.prompt_token_ids) - 1
    return PromptLogprobs(
        [-1.0 - i / 10 for i in range(num)],
        [i + 1 for i in range(num)],
        [[(100 + j, -0.25 - j / 10) for j in range(k)] for _ in range(num)],
    )
