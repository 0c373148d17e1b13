"""One HTTP request's generation: its engine requests (one per choice), the deltas they send
back, and the per-choice processing, timing and clean-up.

All choices of a request share one asyncio.Queue in the engine client; `receive()` takes what
has arrived and turns it into per-choice updates. An engine error raises `APIError`. Whatever
way the session ends (finished, stop string, client gone, error), `close()` aborts upstream
every choice that is still running.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pagedserve.services.gateway.engine_client import EngineClient
from pagedserve.services.gateway.errors import APIError, from_engine
from pagedserve.services.gateway.logprob_formatter import TokenLogprob
from pagedserve.services.gateway.metrics import GatewayMetrics
from pagedserve.services.gateway.output_processor import ChoiceProcessor, ChoiceUpdate
from pagedserve.services.gateway.replay_guard import ReplayMismatch
from pagedserve.services.gateway.request_builder import beam_leaders
from pagedserve.services.gateway.request_metrics import FinishedChoice
from pagedserve.services.gateway.response_formatter import Usage
from pagedserve.shared.protocol import (
    ERROR_ENGINE,
    ERROR_QUEUE_FULL,
    BeamOutput,
    GenerateRequest,
    TokenDelta,
)


@dataclass(slots=True)
class ChoiceTiming:
    arrival: float
    last_token_at: float = 0.0
    first_token_wall: float = 0.0  # unix seconds, to compare with the engine's scheduled_at
    finish_wall: float = 0.0


class CompletionSession:
    def __init__(
        self,
        client: EngineClient,
        metrics: GatewayMetrics,
        requests: list[GenerateRequest],
        processors: list[ChoiceProcessor],
        num_choices_per_prompt: int,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.requests = requests
        self.processors = processors
        self.n = num_choices_per_prompt
        self.index_of = {r.request_id: i for i, r in enumerate(requests)}
        self.timings = [ChoiceTiming(arrival=time.monotonic()) for _ in requests]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in requests]
        self.queue: asyncio.Queue[TokenDelta] = asyncio.Queue()
        self._pending: list[TokenDelta] = []
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()

    async def submit(self) -> None:
        for request in self.requests:
            self.client.open_stream(request.request_id, self.queue)
        try:
            await self.client.submit(beam_leaders(self.requests, self.n))
        except APIError as exc:
            if exc.code == ERROR_QUEUE_FULL:  # the gateway's --max-pending-requests
                self.metrics.requests.rejected()
            self._close_streams()
            raise

    @property
    def finished(self) -> bool:
        return all(p.finish_reason is not None for p in self.processors)

    async def wait_first(self) -> None:
        """Wait for the first delta (so an engine error can still pick the HTTP status)."""
        delta = await self.queue.get()
        self._pending.append(delta)
        self._raise_if_error(delta)

    async def receive(self) -> list[tuple[int, ChoiceUpdate]]:
        """The updates of every delta that has arrived, waiting for at least one."""
        deltas, self._pending = self._pending, []
        if not deltas:
            deltas.append(await self.queue.get())
        while not self.queue.empty():
            deltas.append(self.queue.get_nowait())
        deltas = [d for delta in deltas for d in self._per_beam(delta)]
        updates: list[tuple[int, ChoiceUpdate]] = []
        for position, delta in enumerate(deltas):
            if delta.finish_reason == "error" and updates:
                self._pending = deltas[position:]  # deliver the text before it first
                return updates
            self._raise_if_error(delta)
            index = self.index_of.get(delta.request_id)
            if index is None or self.processors[index].finish_reason is not None:
                continue
            update = self._process(index, delta)
            self.logprobs[index].extend(update.logprobs)
            self._observe(index, delta, update)
            if update.stopped_by_string:
                await self.client.abort([delta.request_id], "stop")
            updates.append((index, update))
        return updates

    def _per_beam(self, delta: TokenDelta) -> list[TokenDelta]:
        """A beam search's last delta as one finished delta per beam, for the choices from
        its own on (its request id is the first choice's)."""
        first = self.index_of.get(delta.request_id)
        if delta.beams is None or first is None:
            return [delta]
        return [
            _beam_delta(self.requests[first + i].request_id, beam, delta)
            for i, beam in enumerate(delta.beams)
        ]

    def _process(self, index: int, delta: TokenDelta) -> ChoiceUpdate:
        try:
            return self.processors[index].process(delta)
        except ReplayMismatch as exc:
            # finish_reason stays None, so that close() aborts it upstream
            raise from_engine(str(exc), ERROR_ENGINE) from exc

    def _raise_if_error(self, delta: TokenDelta) -> None:
        if delta.finish_reason == "error":
            index = self.index_of.get(delta.request_id)
            if index is not None:  # the engine already dropped it: nothing to abort
                self.processors[index].finish_reason = "error"
            self.metrics.requests.finished(self.client.engine_of(delta.request_id), "error")
            if delta.error_code == ERROR_QUEUE_FULL:  # an engine's --max-waiting
                self.metrics.requests.rejected()
            raise from_engine(delta.error, delta.error_code)

    def _observe(self, index: int, delta: TokenDelta, update: ChoiceUpdate) -> None:
        now = time.monotonic()
        timing = self.timings[index]
        metrics = self.metrics.requests
        engine = self.client.engine_of(delta.request_id)
        if delta.token_ids:
            if timing.last_token_at == 0.0:
                metrics.first_token(engine, now - timing.arrival)
                timing.first_token_wall = time.time()
            else:
                metrics.token_gap(engine, now - timing.last_token_at)
            timing.last_token_at = now
        if update.finish_reason is not None:
            timing.finish_wall = time.time()
            metrics.finished(engine, update.finish_reason)
            metrics.completed(self._finished_choice(index, engine, delta), now - timing.arrival)
            self._spawn(self._observe_engine_times(self.requests[index], engine, timing))

    def _finished_choice(self, index: int, engine: str, delta: TokenDelta) -> FinishedChoice:
        request, timing = self.requests[index], self.timings[index]
        processor = self.processors[index]
        decode_s = None
        if timing.first_token_wall > 0:
            decode_s = max(0.0, timing.finish_wall - timing.first_token_wall)
        return FinishedChoice(
            engine=engine,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_cached_tokens=processor.num_cached_tokens,
            num_generation_tokens=processor.num_output_tokens,
            num_preemptions=delta.num_preemptions,
            n=self.n,
            max_tokens=request.sampling.max_tokens,
            decode_s=decode_s,
        )

    async def _observe_engine_times(
        self, request: GenerateRequest, engine: str, timing: ChoiceTiming
    ) -> None:
        """Queue, prefill and inference times start when the engine first scheduled it."""
        scheduled_at = await self.client.scheduled_at(request.request_id)
        if scheduled_at <= 0:
            return
        first_token = timing.first_token_wall or timing.finish_wall  # max_tokens 0: none
        self.metrics.requests.engine_times(
            engine,
            queue_s=max(0.0, scheduled_at - request.arrival_time),
            prefill_s=max(0.0, first_token - scheduled_at),
            inference_s=max(0.0, timing.finish_wall - scheduled_at),
        )

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def usage(self) -> Usage:
        """Prompt tokens count once per prompt, however many choices it has (as OpenAI)."""
        firsts = range(0, len(self.requests), self.n)
        return Usage(
            prompt_tokens=sum(len(self.requests[i].prompt_token_ids) for i in firsts),
            completion_tokens=sum(p.num_output_tokens for p in self.processors),
            cached_tokens=sum(self.processors[i].num_cached_tokens for i in firsts),
        )

    async def close(self, reason: str = "abort") -> None:
        """Abort upstream every choice still running; idempotent."""
        if self._closed:
            return
        self._closed = True
        running = [
            r.request_id
            for r, p in zip(self.requests, self.processors, strict=True)
            if p.finish_reason is None
        ]
        engines = [self.client.engine_of(request_id) for request_id in running]
        self._close_streams()
        if running:
            for engine in engines:
                self.metrics.requests.finished(engine, "abort")
            await self.client.abort(running, reason)

    def _close_streams(self) -> None:
        for request in self.requests:
            self.client.close_stream(request.request_id)


def _beam_delta(request_id: str, beam: BeamOutput, delta: TokenDelta) -> TokenDelta:
    return TokenDelta(
        request_id=request_id,
        token_ids=beam.token_ids,
        finish_reason=beam.finish_reason,
        num_prompt_tokens=delta.num_prompt_tokens,
        num_output_tokens=len(beam.token_ids) + (beam.stop_token_id is not None),
        num_cached_tokens=delta.num_cached_tokens,
        num_preemptions=delta.num_preemptions,
        stop_token_id=beam.stop_token_id,
    )
