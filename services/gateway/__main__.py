"""`python -m services.gateway`: the OpenAI-compatible HTTP gateway, under uvicorn.

Every flag can also come from a `PAGEDSERVE_<FLAG>` environment variable (e.g.
`PAGEDSERVE_API_KEY`, `PAGEDSERVE_REDIS_URL`); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable

from services.gateway.gateway_config import GatewayConfig
from shared.config import DEFAULT_MODEL, DEFAULT_NAMESPACE, env_default
from shared.logging import setup_logging


def _optional_int(name: str) -> int | None:
    value = env_default(name, "")
    return int(value) if value else None


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    parser = argparse.ArgumentParser(prog="python -m services.gateway", description=__doc__)
    add = parser.add_argument
    add("--model", default=env_default("model", DEFAULT_MODEL), help="alias or model directory")
    add("--served-model-name", default=env_default("served_model_name", "") or None)
    add("--redis-url", default=env_default("redis_url", "redis://127.0.0.1:6379/0"))
    add("--namespace", default=env_default("namespace", DEFAULT_NAMESPACE))
    add("--host", default=env_default("host", "127.0.0.1"), help="bind address (loopback)")
    add("--port", type=int, default=int(env_default("port", "8000")))
    add("--api-key", default=env_default("api_key", "") or None, help="require this Bearer key")
    add(
        "--metrics-require-key",
        action="store_true",
        default=env_default("metrics_require_key", "") in ("1", "true", "yes"),
        help="ask for the API key on /metrics too (open by default)",
    )
    add("--gateway-id", default=env_default("gateway_id", ""), help="default: random")
    add("--max-model-len", type=int, default=_optional_int("max_model_len"))
    add(
        "--max-pending-requests", type=int, default=int(env_default("max_pending_requests", "4096"))
    )
    add(
        "--shutdown-timeout",
        type=float,
        default=float(env_default("shutdown_timeout", "30")),
        help="on SIGTERM: seconds open requests may take before they are aborted",
    )
    add(
        "--engine-loss-timeout",
        type=float,
        default=float(env_default("engine_loss_timeout", "30")),
        help="seconds without any live engine after which open requests fail with a 503",
    )
    _add_limit_flags(add)
    args = parser.parse_args(argv)
    try:
        return GatewayConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            redis_url=args.redis_url,
            namespace=args.namespace,
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            metrics_require_key=args.metrics_require_key,
            gateway_id=args.gateway_id or f"gw-{uuid.uuid4().hex[:12]}",
            max_model_len=args.max_model_len,
            max_pending_requests=args.max_pending_requests,
            shutdown_timeout=args.shutdown_timeout,
            engine_loss_timeout=args.engine_loss_timeout,
            max_body_bytes=args.max_body_bytes,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_seqs_per_request=args.max_seqs_per_request,
            max_requests_per_client=args.max_requests_per_client,
            tokenizer_threads=args.tokenizer_threads,
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _add_limit_flags(add: Callable[..., object]) -> None:
    """What keeps cheap requests cheap (admission.py, http_limits.py, client_limits.py)."""
    add(
        "--max-body-bytes",
        type=int,
        default=int(env_default("max_body_bytes", "8388608")),
        help="request bodies over this many bytes get a 413",
    )
    add(
        "--header-timeout",
        type=float,
        default=float(env_default("header_timeout", "10")),
        help="seconds a request's headers may take to arrive (slow clients get a 408)",
    )
    add(
        "--body-timeout",
        type=float,
        default=float(env_default("body_timeout", "30")),
        help="seconds a request's body may take to arrive after its headers",
    )
    add(
        "--max-seqs-per-request",
        type=int,
        default=int(env_default("max_seqs_per_request", "256")),
        help="most sequences (prompts x n) one request may ask for",
    )
    add(
        "--max-requests-per-client",
        type=int,
        default=int(env_default("max_requests_per_client", "1024")),
        help="open API requests per API key (else per address) before a 429; 0: no bound",
    )
    add("--tokenizer-threads", type=int, default=int(env_default("tokenizer_threads", "2")),
        help="prompts tokenized at once; the others wait their turn")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logger = setup_logging("gateway")
    import uvicorn

    from services.gateway.app import build_app
    from services.gateway.drain import Drainer, DrainingServer
    from services.gateway.engine_client import EngineClient
    from services.gateway.http_limits import bounded_http_protocol
    from services.gateway.tokenizer import load_tokenizer

    info = load_tokenizer(config.model, config.max_model_len)
    client = EngineClient(
        config.redis_url,
        config.namespace,
        config.gateway_id,
        config.max_pending_requests,
        config.engine_loss_timeout,
    )
    drainer = Drainer(client, config.shutdown_timeout)
    app = build_app(config, info, client, drainer)
    logger.info(
        "gateway %s serving %s (max_model_len %d) on http://%s:%d",
        config.gateway_id, config.model_name, info.max_model_len, config.host, config.port,
    )  # fmt: skip
    protocol = bounded_http_protocol(config.header_timeout, config.body_timeout)
    server = DrainingServer(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", http=protocol),
        drainer,
    )
    server.run()


if __name__ == "__main__":
    main()
