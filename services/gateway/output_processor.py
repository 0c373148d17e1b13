"""One choice's output: token deltas in, visible text (detokenized, stop strings cut), logprobs
and counts out."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.detokenizer import IncrementalDetokenizer
from services.gateway.logprob_formatter import TokenLogprob
from services.gateway.replay_guard import ReplayGuard
from services.gateway.stop_checker import StopChecker
from services.gateway.tokenizer import TokenizerInfo
from shared.protocol import TokenDelta


@dataclass(slots=True)
class ChoiceUpdate:
    """What one delta added to a choice."""

    text: str
    logprobs: list[TokenLogprob]
    finish_reason: str | None  # "stop" | "length" | "abort"; None while running
    stopped_by_string: bool = False  # the gateway must abort the request upstream


@dataclass(slots=True)
class ChoiceProcessor:
    info: TokenizerInfo
    stop: tuple[str, ...]
    want_logprobs: bool
    detokenizer: IncrementalDetokenizer = field(init=False)
    stop_checker: StopChecker = field(init=False)
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""

    def __post_init__(self) -> None:
        self.detokenizer = IncrementalDetokenizer(self.info.tokenizer)
        self.stop_checker = StopChecker(self.stop)

    def process(self, delta: TokenDelta) -> ChoiceUpdate:
        """Apply one (non-error) delta. Once finished, further deltas change nothing. Tokens
        replayed after an engine restart are dropped (`ReplayGuard`; raises `ReplayMismatch`)."""
        if self.finish_reason is not None:
            return ChoiceUpdate("", [], None)
        delta = self.replay_guard.admit(delta)
        self.num_prompt_tokens = max(self.num_prompt_tokens, delta.num_prompt_tokens)
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        # the sampled stop token (EOS or a stop_token_ids hit) is not shown, but it was
        # generated: OpenAI and vLLM count it in usage
        self.num_output_tokens += len(delta.token_ids) + (delta.stop_token_id is not None)
        pieces, logprobs = self._detokenize(delta)
        if delta.finished:
            pieces.append(self.detokenizer.finish())
        visible = self.stop_checker.add("".join(pieces))
        stopped = self.stop_checker.matched is not None
        if delta.finished and not stopped:
            visible += self.stop_checker.flush()
        if stopped:
            self.finish_reason = "stop"
        elif delta.finished:
            self.finish_reason = delta.finish_reason
        self.text += visible
        return ChoiceUpdate(visible, logprobs, self.finish_reason, stopped and not delta.finished)

    def _detokenize(self, delta: TokenDelta) -> tuple[list[str], list[TokenLogprob]]:
        pieces: list[str] = []
        logprobs: list[TokenLogprob] = []
        for position, token_id in enumerate(delta.token_ids):
            offset = len(self.detokenizer.emitted_text)
            pieces.append(self.detokenizer.add([token_id]))
            if self.want_logprobs and delta.logprobs is not None:
                logprobs.append(self._logprob(delta, position, token_id, offset))
        return pieces, logprobs

    def _logprob(
        self, delta: TokenDelta, position: int, token_id: int, offset: int
    ) -> TokenLogprob:
        assert delta.logprobs is not None
        tops = delta.top_logprobs[position] if delta.top_logprobs else []
        return TokenLogprob(
            token=self.info.token_text(token_id),
            logprob=delta.logprobs[position],
            top=[(self.info.token_text(t), lp) for t, lp in tops],
            text_offset=offset,
        )
