"""The health checks that compose runs, against a real Redis and a real HTTP server."""

from __future__ import annotations

import http.server
import threading
import time

import redis

from pagedserve.services.cli.health_probe import check_engine, check_gateway, main
from pagedserve.services.cli.ports import free_port
from pagedserve.shared.keys import RedisKeys
from pagedserve.shared.redis_client import RedisTarget
from pagedserve.shared.status import EngineStatus, to_fields

NS = "probe"


def write_status(client: redis.Redis, age_s: float, workers_alive: bool = True) -> None:
    status = EngineStatus("engine0", time=time.time() - age_s, workers_alive=workers_alive)
    client.hset(RedisKeys(NS).engine("engine0"), mapping=to_fields(status))


def test_engine_health(redis_server, redis_client: redis.Redis) -> None:
    url = redis_server.url
    target = RedisTarget(url)
    assert "has no status at probe:engine:engine0" in check_engine(target, NS, "engine0")
    write_status(redis_client, age_s=1)
    assert check_engine(target, NS, "engine0") is None
    assert main(["engine", "--redis-url", url, "--namespace", NS, "--engine-id", "engine0"]) == 0
    write_status(redis_client, age_s=1, workers_alive=False)
    assert "a worker rank that does not answer" in check_engine(target, NS, "engine0")
    write_status(redis_client, age_s=60)
    assert "status is 60 s old (limit 15 s)" in check_engine(target, NS, "engine0")
    assert main(["engine", "--redis-url", url, "--namespace", NS, "--engine-id", "engine0"]) == 1
    assert "cannot reach Redis" in check_engine(RedisTarget("redis://127.0.0.1:1/0"), NS, "engine0")
    bad_sentinel = ["engine", "--redis-sentinel", "127.0.0.1/primary", "--namespace", NS]
    assert main(bad_sentinel) == 2


def test_gateway_health() -> None:
    codes = {"/health": 200, "/sick": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(codes.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        assert check_gateway(f"{base}/health") is None
        assert check_gateway(f"{base}/sick") == f"{base}/sick answered 503"
        assert main(["gateway", "--url", f"{base}/sick"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "unreachable" in check_gateway(f"{base}/health")
