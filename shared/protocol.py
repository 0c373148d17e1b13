"""The wire protocol: every message between gateway, scheduler and workers, and its codec.

Each message is a frozen dataclass registered under a one-byte tag. `encode` turns a message
(nested messages, lists and dicts included) into msgpack bytes in which every dataclass is a
msgpack extension `(tag, [field values in declaration order])`; `decode` rebuilds the exact
classes. No pickle: an unknown tag or a wrong field count is a `ProtocolError`.

Who sends what:

    gateway   -> scheduler  GenerateRequest, AbortRequest          (Redis streams)
    scheduler -> gateway    OutputBatch of TokenDelta              (Redis stream per gateway)
    scheduler -> workers    StepPlan, Shutdown                     (ZeroMQ PUB, every rank)
    worker    -> scheduler  WorkerHello, StepResult, Heartbeat     (ZeroMQ PUSH -> PULL)

A step plan sends a sequence in full once (`NewSequence`), then only what changed
(`CachedSequence`, with any draft tokens to check), and the ids of sequences whose state the
workers should drop.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from pagedserve.shared.request_bounds import MAX_LOGPROBS, MAX_PROMPT_LOGPROBS


class ProtocolError(ValueError):
    """Bytes that do not decode to a known message."""


# ---------------------------------------------------------------------------------------------
# Requests (gateway -> scheduler)


MAX_BEAM_WIDTH = 10  # beams rank 2 * width candidates from the top MAX_LOGPROBS logprobs
GREEDY_TEMPERATURE = 1e-5  # below this, sampling is greedy (as vLLM's _SAMPLING_EPS)

# StructuredOutput.kind values: what `spec` holds. The gateway turns every API form (OpenAI's
# response_format and tools, vLLM's structured_outputs and guided_*) into one of these.
STRUCTURED_KINDS = ("json", "json_object", "regex", "grammar", "lark", "structural_tag")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the generated text: `kind` "json" (spec: a JSON schema, serialized with
    sorted keys so that equal schemas share one compiled grammar), "json_object" (any JSON
    object; spec ""), "regex", "grammar" (EBNF / GBNF, `root ::= ...`) or "lark" (a Lark
    grammar, `start: ...`, compiled by xgrammar's own Lark front end) or "structural_tag" (an
    xgrammar structural tag, JSON: free text with constrained tagged parts, as tool calls)."""

    kind: str
    spec: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens for one sequence. Validation with user-facing messages happens in the
    gateway; `validate()` here is the engine's last line of defence."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: all tokens (as vLLM)
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()  # the model's end tokens; ignored with ignore_eos
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0: the sampled token's; k: plus top k
    # log-softmax of every prompt position's token (and its top k); None: none
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit) pairs
    structured_output: StructuredOutput | None = None  # constrained decoding; None: free text
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be sampled; None: all
    # token sequences never to complete: a word's last token is masked after its other tokens
    # (vLLM's bad_words, tokenized by the gateway with and without a leading space)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # beam search with this many beams (0: none); n best returned, ranked by the cumulative
    # logprob over (output length ** length_penalty), as transformers' beam search
    beam_width: int = 0
    length_penalty: float = 1.0
    n: int = 1  # outputs of one request: > 1 only with beam search (n <= beam_width)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def validate(self) -> None:
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            problems.append(f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            problems.append(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 0:
            problems.append(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            problems.append(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            problems.append(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if (
            self.prompt_logprobs is not None
            and not 0 <= self.prompt_logprobs <= MAX_PROMPT_LOGPROBS
        ):
            problems.append(
                f"prompt_logprobs must be in [0, {MAX_PROMPT_LOGPROBS}], got {self.prompt_logprobs}"
            )
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not math.isfinite(bias):
                problems.append(f"logit_bias needs token ids >= 0 and finite biases, got "
                                f"{token_id}: {bias}")  # fmt: skip
                break
        structured = self.structured_output
        if structured is not None and structured.kind not in STRUCTURED_KINDS:
            problems.append(
                f"structured_output.kind must be one of {STRUCTURED_KINDS}, got {structured.kind!r}"
            )
        problems += self._mask_problems() + self._beam_problems()
        if problems:
            raise ValueError("; ".join(problems))

    def _beam_problems(self) -> list[str]:
        if not self.beam_width:
            return [] if self.n == 1 else [f"n must be 1 without beam search, got {self.n}"]
        problems = []
        if not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            problems.append(f"beam_width must be in [1, {MAX_BEAM_WIDTH}], got {self.beam_width}")
        if not 1 <= self.n <= self.beam_width:
            problems.append(f"n must be in [1, beam_width={self.beam_width}], got {self.n}")
        if not math.isfinite(self.length_penalty):
            problems.append(f"length_penalty must be finite, got {self.length_penalty}")
        if self.max_tokens < 1:
            problems.append("beam search needs max_tokens >= 1")
        unsupported = {
            "prompt_logprobs": self.prompt_logprobs is not None,
            "structured_output": self.structured_output is not None,
            "logit_bias": bool(self.logit_bias),
            "allowed_token_ids": self.allowed_token_ids is not None,
            "bad_words": bool(self.bad_words_token_ids),
        }
        for name, used in unsupported.items():
            if used:
                problems.append(f"{name} cannot be combined with beam search")
        return problems

    def _mask_problems(self) -> list[str]:
        problems = []
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            problems.append("allowed_token_ids must not be empty")
        if any(t < 0 for t in self.allowed_token_ids or ()):
            problems.append("allowed_token_ids must be >= 0")
        if any(not word or min(word) < 0 for word in self.bad_words_token_ids):
            problems.append("bad_words_token_ids must be non-empty lists of ids >= 0")
        return problems


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    gateway_id: str = ""  # whose output stream gets the deltas; "" for in-process use
    arrival_time: float = 0.0  # unix seconds, set by whoever first accepts the request
    priority: int = 0  # lower runs earlier under the priority policy
    # a tenant's prefix-cache namespace: requests hit only blocks cached under the same salt
    cache_salt: str | None = None
    # the n samples of one prompt (parallel sampling) share it: the scheduler admits the
    # others once the first has computed the prompt's full blocks, which they then share
    sample_group: str | None = None


@dataclass(frozen=True, slots=True)
class AbortRequest:
    request_ids: list[str]
    reason: str = "abort"


# ---------------------------------------------------------------------------------------------
# Outputs (scheduler -> gateway)


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """The model's log-softmax at every prompt position after the first: entry i is about
    prompt token i + 1 given tokens 0..i (the first token has no logprob)."""

    token_logprobs: list[float]
    ranks: list[int]  # 1 + how many tokens were more likely than the prompt's own
    top_logprobs: list[list[tuple[int, float]]]  # per position, best first (k each)


# TokenDelta.error_code values: what kind of failure, so the gateway can pick the HTTP status.
ERROR_QUEUE_FULL = "queue_full"  # retryable: 503 with Retry-After
ERROR_INVALID_REQUEST = "invalid_request"  # the request can never run: 400
ERROR_ENGINE = "engine_error"  # a worker or engine failure: 500-class, not the client's fault


@dataclass(frozen=True, slots=True)
class BeamOutput:
    """One finished beam of a beam search, as shown to the client (a stop token left out)."""

    token_ids: list[int]
    cumulative_logprob: float
    score: float  # what beams are ranked by: cumulative_logprob / length ** length_penalty
    finish_reason: str
    stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New tokens of one request since the last delta, and how it finished if it did."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None = None  # one per token, when asked for
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, best first
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # a message the client may see, with finish_reason "error"
    error_code: str | None = None  # ERROR_* below: how the gateway should answer an error
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0  # times the engine preempted it so far
    stop_token_id: int | None = None  # the stop token id that ended it, if any
    prompt_logprobs: PromptLogprobs | None = None  # once, with the first token, when asked
    beams: list[BeamOutput] | None = None  # beam search: the n best, best first, at the end

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class OutputBatch:
    """Every delta for one gateway from one engine step, in one Redis entry."""

    engine_id: str
    deltas: list[TokenDelta]


# ---------------------------------------------------------------------------------------------
# Step plans (scheduler -> workers)


@dataclass(frozen=True, slots=True)
class NewSequence:
    """A sequence the workers have not seen (or have dropped): everything they need."""

    seq_id: str
    token_ids: list[int]  # every known token: prompt, then outputs so far (on resume)
    num_prompt_tokens: int
    num_computed_tokens: int  # tokens whose KV is already cached (prefix-cache hits)
    num_scheduled_tokens: int  # tokens to compute this step, from num_computed_tokens on
    block_ids: list[int]  # the whole block table
    sampling: SamplingParams
    # the worker appends what it samples for this sequence this step to its own tokens: the
    # scheduler will not send it back, and may already have planned the next step on it
    keep_sample: bool = False


@dataclass(frozen=True, slots=True)
class CachedSequence:
    """A sequence the workers already hold: only what changed since the last plan."""

    seq_id: str
    new_token_ids: list[int]  # tokens appended since the last plan (last step's sample)
    new_block_ids: list[int]  # blocks appended to its block table
    num_computed_tokens: int
    num_scheduled_tokens: int  # includes the draft tokens
    # speculative tokens computed after the known ones this step (never kept by the workers):
    # the step samples after the last known token and after each draft
    draft_token_ids: list[int] = field(default_factory=list)
    keep_sample: bool = False  # as in NewSequence


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One engine step. A sequence is sampled when this step reaches its last known token,
    i.e. `num_computed_tokens + num_scheduled_tokens == len(all its tokens)`."""

    step_id: int
    new_seqs: list[NewSequence] = field(default_factory=list)
    cached_seqs: list[CachedSequence] = field(default_factory=list)
    finished_seq_ids: list[str] = field(default_factory=list)  # drop state (done, aborted)
    preempted_seq_ids: list[str] = field(default_factory=list)  # drop state (will re-send)
    # (source, destination) KV blocks to copy before the step runs: copy-on-write of blocks
    # that forked beams shared
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_scheduled_tokens for s in self.new_seqs) + sum(
            s.num_scheduled_tokens for s in self.cached_seqs
        )

    @property
    def is_empty(self) -> bool:
        return not (self.new_seqs or self.cached_seqs)


@dataclass(frozen=True, slots=True)
class Shutdown:
    reason: str = ""


# ---------------------------------------------------------------------------------------------
# Worker messages (worker -> scheduler)


@dataclass(frozen=True, slots=True)
class WorkerHello:
    rank: int
    world_size: int
    num_blocks: int  # KV blocks this rank can hold; the scheduler takes the minimum
    block_size: int
    max_model_len: int
    model: str
    pid: int = 0
    # the per-step token budget this rank sized itself for (its device default unless given);
    # a scheduler given none adopts rank 0's
    max_num_batched_tokens: int = 2048
    vocab_size: int = 0  # token ids the model knows are below this; 0: unknown
    # n-gram drafts per sequence and step on this rank's device by default; a scheduler given
    # none adopts rank 0's (`shared.config.default_num_speculative_tokens`)
    num_speculative_tokens: int = 0
    # each layer's sliding window (its KV-cache spec, `shared.kv_cache_spec`); None: full
    sliding_windows: list[int | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What rank 0 sampled in one step, one entry per sampled sequence, in the same order."""

    step_id: int
    seq_ids: list[str]
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    error: str | None = None  # a failed step: every sequence in it is failed with this
    execute_time_s: float = 0.0
    # per sampled sequence: its prompt's logprobs, when asked for and finished this step
    prompt_logprobs: list[PromptLogprobs | None] | None = None
    # sequences that reached their sampling point but were not sampled because their grammar
    # is still compiling: the scheduler runs their last token again next step
    deferred_seq_ids: list[str] = field(default_factory=list)
    # sequences that cannot be sampled at all (their grammar failed to compile): seq_id -> why
    seq_errors: dict[str, str] = field(default_factory=dict)
    # per sampled sequence, the tokens that follow token_ids[i] when it had drafts: the drafts
    # that matched what was sampled, then the token sampled after them; None: no drafts
    more_token_ids: list[list[int]] | None = None


ROLE_SCHEDULER = "scheduler"
ROLE_WORKER = "worker"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """ "I am alive", both ways. A scheduler's names its epoch (one view of its workers: a
    worker that sees a new one drops its state and says hello); a worker's names its rank."""

    role: str  # ROLE_SCHEDULER | ROLE_WORKER
    time: float
    step_id: int = -1  # the last step the sender published (scheduler) or started (worker)
    rank: int = 0  # a worker's rank
    epoch: str = ""  # a scheduler's epoch

    @classmethod
    def from_scheduler(cls, epoch: str, step_id: int) -> Heartbeat:
        return cls(role=ROLE_SCHEDULER, time=time.time(), step_id=step_id, epoch=epoch)

    @classmethod
    def from_worker(cls, rank: int, step_id: int) -> Heartbeat:
        return cls(role=ROLE_WORKER, time=time.time(), step_id=step_id, rank=rank)


# ---------------------------------------------------------------------------------------------
# Codec

_MESSAGE_TYPES: tuple[type, ...] = (
    SamplingParams,
    GenerateRequest,
    AbortRequest,
    TokenDelta,
    OutputBatch,
    NewSequence,
    CachedSequence,
    StepPlan,
    Shutdown,
    WorkerHello,
    StepResult,
    Heartbeat,
    PromptLogprobs,  # new types go last: a message's tag is its position
    StructuredOutput,
    BeamOutput,
)
_TAG_OF: dict[type, int] = {cls: tag for tag, cls in enumerate(_MESSAGE_TYPES, start=1)}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _MESSAGE_TYPES
}
# A message's field values in order, read in C (`attrgetter` of one name returns no tuple).
_VALUES_OF: dict[type, Any] = {
    cls: operator.attrgetter(*names) if len(names) > 1 else (lambda o, n=names[0]: (getattr(o, n),))
    for cls, names in _FIELD_NAMES.items()
}


def _default(obj: Any) -> msgpack.ExtType:
    cls = type(obj)
    tag = _TAG_OF.get(cls)
    if tag is None:
        raise ProtocolError(f"cannot encode {cls.__name__}: not a protocol message")
    values = _VALUES_OF[cls](obj)
    return msgpack.ExtType(tag, msgpack.packb(values, default=_default, use_bin_type=True))


def _ext_hook(tag: int, data: bytes) -> Any:
    if not 1 <= tag <= len(_MESSAGE_TYPES):
        raise ProtocolError(f"unknown message tag {tag}")
    cls = _MESSAGE_TYPES[tag - 1]
    values = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    names = _FIELD_NAMES[cls]
    if not isinstance(values, list) or len(values) != len(names):
        raise ProtocolError(f"{cls.__name__} needs {len(names)} fields")
    if cls is not SamplingParams:  # the only one with fields to turn back into tuples
        return cls(*values)  # every field is an init field, in order
    kwargs = dict(zip(names, values, strict=True))
    # msgpack sends tuples as lists: the hashable, frozen forms back
    for name in ("stop_token_ids", "eos_token_ids"):
        kwargs[name] = tuple(kwargs[name])
    kwargs["logit_bias"] = tuple((int(t), float(b)) for t, b in kwargs["logit_bias"])
    if kwargs["allowed_token_ids"] is not None:
        kwargs["allowed_token_ids"] = tuple(kwargs["allowed_token_ids"])
    kwargs["bad_words_token_ids"] = tuple(tuple(w) for w in kwargs["bad_words_token_ids"])
    return SamplingParams(**kwargs)


def encode(message: Any) -> bytes:
    """Serialize a message (or a plain structure holding messages) to msgpack bytes."""
    return msgpack.packb(message, default=_default, use_bin_type=True)


def decode(data: bytes) -> Any:
    """Inverse of `encode`. Raises `ProtocolError` on anything that is not a valid message."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"malformed message: {exc}") from exc
