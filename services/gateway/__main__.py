"""`python -m pagedserve.services.gateway`: the OpenAI-compatible HTTP gateway, under uvicorn.

Every flag can also come from a `PAGEDSERVE_<FLAG>` environment variable (e.g.
`PAGEDSERVE_API_KEY`, `PAGEDSERVE_REDIS_URL`); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import uuid

from pagedserve.services.gateway.chat_template import load_chat_template
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.shared.logging import setup_logging
from pagedserve.shared.options import add_options, use
from pagedserve.shared.redis_client import RedisTarget
from pagedserve.shared.startup_heap import freeze_startup_heap

GATEWAY_OPTIONS = (
    use("model", help="alias or model directory"), use("served_model_name", help=None),
    "redis_url", "redis_sentinel", "namespace", "host", "port",
    use("api_key", help="require this Bearer key"), "metrics_require_key", "gateway_id",
    use("max_model_len", help=None), "max_pending_requests", "shutdown_timeout",
    "engine_loss_timeout", "routing", "max_body_bytes", "header_timeout", "body_timeout",
    "max_seqs_per_request", "max_requests_per_client", "tokenizer_threads",
    "chat_template", "enable_auto_tool_choice", "tool_call_parser",
    "trust_request_chat_template",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> GatewayConfig:
    parser = argparse.ArgumentParser(
        prog="python -m pagedserve.services.gateway", description=__doc__
    )
    add_options(parser, *GATEWAY_OPTIONS)
    args = parser.parse_args(argv)
    try:
        RedisTarget.of(args.redis_url, args.redis_sentinel)  # fail here, with the reason
        if args.chat_template is not None:
            load_chat_template(args.chat_template)  # fail here, with the reason
        return GatewayConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            redis_url=args.redis_url,
            redis_sentinel=args.redis_sentinel,
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
            routing=args.routing,
            max_body_bytes=args.max_body_bytes,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            max_seqs_per_request=args.max_seqs_per_request,
            max_requests_per_client=args.max_requests_per_client,
            tokenizer_threads=args.tokenizer_threads,
            chat_template=args.chat_template,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            tool_call_parser=args.tool_call_parser,
            trust_request_chat_template=args.trust_request_chat_template,
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logger = setup_logging("gateway")
    import uvicorn

    from pagedserve.services.gateway.app import build_app
    from pagedserve.services.gateway.drain import Drainer, DrainingServer
    from pagedserve.services.gateway.engine_client import EngineClient
    from pagedserve.services.gateway.http_limits import bounded_http_protocol
    from pagedserve.services.gateway.tokenizer import load_tokenizer

    info = load_tokenizer(config.model, config.max_model_len)
    if config.chat_template is not None:
        info.tokenizer.chat_template = load_chat_template(config.chat_template)
    client = EngineClient(
        RedisTarget.of(config.redis_url, config.redis_sentinel),
        config.namespace,
        config.gateway_id,
        config.max_pending_requests,
        config.engine_loss_timeout,
        config.routing,
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
    logger.info("%d start-up objects frozen", freeze_startup_heap())
    server.run()


if __name__ == "__main__":
    main()
