"""`pagedserve queue [show ID]`: inspect the Redis queue (read-only)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from services.cli.queue_reader import (
    QueueError,
    connect,
    default_redis_url,
    read_queue,
    read_request,
)
from services.cli.queue_view import render_queue, render_request
from shared.config import DEFAULT_NAMESPACE, env_default


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "queue",
        help="inspect the request queue, engines and gateways in Redis",
        description="Show request stream depth, pending requests per engine, the oldest wait, "
        "each engine's load and heartbeat, and the live gateways; `queue show ID` shows one "
        "request's state and timeline.",
    )
    parser.add_argument("--redis-url", default=default_redis_url(), help="default: $REDIS_URL")
    parser.add_argument("--namespace", default=env_default("namespace", DEFAULT_NAMESPACE))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    actions = parser.add_subparsers(dest="queue_command", metavar="{show}")
    show = actions.add_parser("show", help="one request's state and timeline")
    show.add_argument("request_id", metavar="ID")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        client = connect(args.redis_url)
        try:
            if getattr(args, "queue_command", None) == "show":
                status = read_request(client, args.namespace, args.request_id)
                out = json.dumps(asdict(status)) if args.json else render_request(status)
            else:
                snapshot = read_queue(client, args.namespace)
                out = json.dumps(snapshot) if args.json else render_queue(snapshot)
        finally:
            client.close()
    except QueueError as exc:
        print(f"pagedserve queue: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
