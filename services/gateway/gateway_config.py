"""The gateway's settings, from flags or `PAGEDSERVE_*` environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.shared.cache_summary import ROUTING_POLICIES
from pagedserve.shared.config import DEFAULT_MODEL, DEFAULT_NAMESPACE

MAX_BODY_BYTES = 8 * 1024 * 1024
TOOL_CALL_PARSERS = ("hermes",)


@dataclass(frozen=True)
class GatewayConfig:
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None  # the name clients send; None: `model`
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_sentinel: str | None = None  # "HOST:PORT,.../SERVICE": the primary via sentinels
    namespace: str = DEFAULT_NAMESPACE
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000
    api_key: str | None = None
    metrics_require_key: bool = False
    gateway_id: str = ""  # "" : generated at start
    max_model_len: int | None = None  # None: the model's own
    max_pending_requests: int = 4096  # unfinished requests in the queue beyond which: 503
    max_body_bytes: int = MAX_BODY_BYTES
    shutdown_timeout: float = 30.0  # on SIGTERM: seconds open requests get before "abort"
    engine_loss_timeout: float = 30.0  # no live engine this long: open requests end in a 503
    routing: str = "cache"  # cache | load | shared (services/gateway/router.py)
    # Cheap requests stay cheap (see admission.py, http_limits.py, client_limits.py):
    header_timeout: float = 10.0  # a request's headers must arrive within this (slowloris)
    body_timeout: float = 30.0  # and its body within this after the headers
    # vLLM's default max_num_seqs: one request may fill one full engine batch, not more.
    max_seqs_per_request: int = 256  # prompts x n
    # A quarter of the default queue bound: four clients at their limit still fit.
    max_requests_per_client: int = 1024  # open /v1/ requests per API key or address; 0: no bound
    tokenizer_threads: int = 2  # prompts tokenized at once; the others wait
    chat_template: str | None = None  # a template file or text; None: the model's
    enable_auto_tool_choice: bool = False  # tool_choice "auto": the model may call tools
    tool_call_parser: str | None = None  # how calls are read from the text: "hermes"
    trust_request_chat_template: bool = False  # a request's own `chat_template` is honoured

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")
        if self.max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {self.max_pending_requests}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(
                f"routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}"
            )
        if self.engine_loss_timeout <= 0:
            raise ValueError(f"engine_loss_timeout must be > 0, got {self.engine_loss_timeout}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        for name in ("header_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_seqs_per_request", "tokenizer_threads", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_requests_per_client < 0:
            raise ValueError(
                f"max_requests_per_client must be >= 0 (0: no bound), "
                f"got {self.max_requests_per_client}"
            )
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise ValueError(
                f"tool_call_parser must be one of {TOOL_CALL_PARSERS}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(
                "--enable-auto-tool-choice needs --tool-call-parser (hermes) to read the calls"
            )
        if self.api_key == "":
            raise ValueError("api_key must not be empty (leave it unset to turn auth off)")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model
