"""Health checks that a container runtime (or a supervisor) can run as a command.

    python -m pagedserve.services.cli.health_probe gateway --url http://127.0.0.1:8000/health
    python -m pagedserve.services.cli.health_probe engine --redis-url URL --namespace NS \
        --engine-id ID  [--redis-sentinel HOST:PORT,.../SERVICE]

Exit status 0 when healthy, 1 with a one-line reason on stderr otherwise. An engine is
healthy when its status record in Redis is fresh and says every worker rank answers.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.options import add_options, use
from pagedserve.shared.redis_client import RedisTarget, sync_redis
from pagedserve.shared.status import ENGINE_STATUS_TTL_S, EngineStatus, from_fields


def check_gateway(url: str, timeout_s: float = 3.0) -> str | None:
    """None when GET `url` answers 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return None if response.status == 200 else f"{url} answered {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} unreachable: {exc}"


def check_engine(redis: RedisTarget, namespace: str, engine_id: str) -> str | None:
    """None when engine `engine_id` has a fresh status with every worker alive, else why not."""
    key = RedisKeys(namespace).engine(engine_id)
    try:
        client = sync_redis(redis, socket_connect_timeout=2, socket_timeout=2)
        fields = client.hgetall(key)
        client.close()
    except (RedisConnectionError, RedisTimeoutError) as exc:
        return f"cannot reach Redis at {redis.describe()}: {exc}"
    if not fields:
        return f"engine {engine_id!r} has no status at {key} (not started, or dead)"
    status = from_fields(EngineStatus, fields)
    age = time.time() - status.time
    if age > ENGINE_STATUS_TTL_S:
        return f"engine {engine_id!r} status is {age:.0f} s old (limit {ENGINE_STATUS_TTL_S} s)"
    if not status.workers_alive:
        return f"engine {engine_id!r} reports a worker rank that does not answer"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.services.cli.health_probe")
    kinds = parser.add_subparsers(dest="kind", required=True)
    gateway = kinds.add_parser("gateway")
    gateway.add_argument("--url", default="http://127.0.0.1:8000/health")
    engine = kinds.add_parser("engine")
    add_options(
        engine, "redis_url", "redis_sentinel", "namespace", use("engine_id", default="engine0")
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "gateway":
        problem = check_gateway(args.url)
    else:
        try:
            target = RedisTarget.of(args.redis_url, args.redis_sentinel)
        except ValueError as exc:
            print(f"invalid configuration: {exc}", file=sys.stderr)
            return 2
        problem = check_engine(target, args.namespace, args.engine_id)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
