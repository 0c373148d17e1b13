"""`pagedserve queue [show ID]`: inspect the Redis queue (read-only).

Without --redis-url (or REDIS_URL) or --redis-sentinel, it finds the `pagedserve serve` running
on this machine (`discovery.py`); with several, --port picks one and `--list` lists them."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from pagedserve.services.cli.discovery import DiscoveryError, choose, live_deployments
from pagedserve.services.cli.queue_reader import (
    QueueError,
    connect,
    default_redis_url,
    read_queue,
    read_request,
)
from pagedserve.services.cli.queue_view import render_queue, render_request
from pagedserve.shared.config import DEFAULT_NAMESPACE, RedisConfig
from pagedserve.shared.options import add_options, use

LOCAL_REDIS = RedisConfig().url


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "queue",
        help="inspect the request queue, engines and gateways in Redis",
        description="Show request stream depth, pending requests per engine, the oldest wait, "
        "each engine's load and heartbeat, and the live gateways; `queue show ID` shows one "
        "request's state and timeline.",
    )
    add_options(
        parser,
        use("redis_url", default=None, env_aliases=("REDIS_URL",),
            help=f"default: $REDIS_URL, else the local `pagedserve serve`'s, else {LOCAL_REDIS}"),
        "redis_sentinel",
        use("namespace", default=None,
            help=f"default: the local serve's, else {DEFAULT_NAMESPACE}"),
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=None, help="the local serve on this port")
    parser.add_argument("--list", action="store_true", help="list the local serve deployments")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    actions = parser.add_subparsers(dest="queue_command", metavar="{show}")
    show = actions.add_parser("show", help="one request's state and timeline")
    show.add_argument("request_id", metavar="ID")
    parser.set_defaults(func=run)


def resolve_target(args: argparse.Namespace) -> tuple[str, str]:
    """(Redis URL, namespace): the flags', else the local serve's, else the defaults."""
    if (args.redis_url or args.redis_sentinel) and args.port is None:
        return args.redis_url, args.namespace or DEFAULT_NAMESPACE
    deployment = choose(live_deployments(), args.port)
    if deployment is not None:
        return deployment.redis_url, args.namespace or deployment.namespace
    return default_redis_url(), args.namespace or DEFAULT_NAMESPACE


def list_deployments(as_json: bool) -> str:
    deployments = live_deployments()
    if as_json:
        return json.dumps([asdict(d) for d in deployments])
    return "\n".join(d.describe() for d in deployments) or "no local pagedserve serve is running"


def run(args: argparse.Namespace) -> int:
    try:
        if args.list:
            print(list_deployments(args.json))
            return 0
        args.redis_url, args.namespace = resolve_target(args)
    except DiscoveryError as exc:
        print(f"pagedserve queue: error: {exc}", file=sys.stderr)
        return 1
    try:
        client = connect(args.redis_url, args.redis_sentinel)
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
