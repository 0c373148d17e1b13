"""The gateway's settings, from flags or `PAGEDSERVE_*` environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import DEFAULT_MODEL, DEFAULT_NAMESPACE

MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None  # the name clients send; None: `model`
    redis_url: str = "redis://127.0.0.1:6379/0"
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

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in [1, 65535], got {self.port}")
        if self.max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {self.max_pending_requests}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.engine_loss_timeout <= 0:
            raise ValueError(f"engine_loss_timeout must be > 0, got {self.engine_loss_timeout}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (leave it unset to turn auth off)")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model
