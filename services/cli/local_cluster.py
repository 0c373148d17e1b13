"""The processes of one `pagedserve serve`, started in dependency order, watched, and stopped
in drain order: gateways first (they finish or abort open requests), then the engine, then
Redis. Signals only set flags here; all the work happens on the main thread."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from types import FrameType
from typing import TextIO

import redis

from services.cli.health_probe import check_gateway
from services.cli.launch_plan import LOOPBACK, LaunchPlan, Ports, ServeOptions, plan_launch
from services.cli.redis_launcher import find_redis_server, redis_server_command
from services.cli.supervisor import Child, ChildExited, ChildSpec, Supervisor
from services.gateway.drain import ABORT_GRACE_S

ENGINE_STOP_TIMEOUT_S = 15.0  # scheduler (its own drain: 5 s) and workers
REDIS_STOP_TIMEOUT_S = 5.0
GATEWAY_EXIT_MARGIN_S = 10.0  # beyond the drain itself: uvicorn closing, Redis clean-up


class LocalCluster:
    def __init__(self, options: ServeOptions, ports: Ports, out: TextIO = sys.stderr) -> None:
        self.options = options
        self.ports = ports
        self.supervisor = Supervisor(out)
        self.stop_requested = threading.Event()
        self.redis: list[Child] = []
        self.engine: list[Child] = []
        self.gateways: list[Child] = []
        self._redis_dir: tempfile.TemporaryDirectory[str] | None = None
        self._num_signals = 0

    @property
    def redis_url(self) -> str:
        return self.options.redis_url or f"redis://{LOOPBACK}:{self.ports.redis}/0"

    @property
    def gateway_urls(self) -> list[str]:
        host = LOOPBACK if self.options.host in ("0.0.0.0", "::", "") else self.options.host
        return [f"http://{host}:{p}" for p in self.ports.gateway_ports(self.options)]

    def run(self, model_dir: str) -> int:
        """Start everything, serve until a signal (0) or a child's death (1), stop everything."""
        previous = {
            s: signal.signal(s, self._on_signal)
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        code = 0
        try:
            if self._start(model_dir):
                self._announce()
                self._watch()
        except ChildExited as exc:
            self.supervisor.say(f"error: {exc}")
            code = 1
        except TimeoutError as exc:
            self.supervisor.say(f"error: {exc}; stopping")
            code = 1
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._num_signals += 1
        self.stop_requested.set()
        if self._num_signals > 1:  # the user insists: no more draining
            for child in self.supervisor.children:
                if child.proc.returncode is not None:  # reaped: its pid may be reused
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)

    def _start(self, model_dir: str) -> bool:
        """False when a signal interrupted start-up."""
        stop, timeout = self.stop_requested.is_set, self.options.startup_timeout
        if self.options.redis_url is None:
            self._redis_dir = tempfile.TemporaryDirectory(prefix="pagedserve-redis-")
            argv = redis_server_command(find_redis_server(), self.ports.redis, self._redis_dir.name)
            self.redis = [self.supervisor.start(ChildSpec("redis", argv))]
        if not self.supervisor.wait_until(
            f"Redis at {self.redis_url} answering PING", self._redis_answers, 10, stop
        ):
            return False
        plan: LaunchPlan = plan_launch(self.options, model_dir, self.redis_url, self.ports)
        self.engine = [self.supervisor.start(spec) for spec in plan.engine]
        engine_ready = lambda: all(c.ready.is_set() for c in self.engine)
        if not self.supervisor.wait_until(
            "the scheduler and workers being ready", engine_ready, timeout, stop
        ):
            return False
        self.gateways = [self.supervisor.start(spec) for spec in plan.gateways]
        urls = [f"{u}/health" for u in self.gateway_urls]
        gateways_ready = lambda: all(check_gateway(u, timeout_s=1) is None for u in urls)
        return self.supervisor.wait_until(
            "the gateway(s) answering /health", gateways_ready, timeout, stop
        )

    def _redis_answers(self) -> bool:
        client = redis.Redis.from_url(
            self.redis_url, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        finally:
            client.close()

    def _announce(self) -> None:
        o, say = self.options, self.supervisor.say
        urls = ", ".join(f"{u}/v1" for u in self.gateway_urls)
        say(f"ready: {o.served_model_name or o.model} on {urls}")
        say(f"queue: pagedserve queue --redis-url {self.redis_url} --namespace {o.namespace}")
        say(
            "press Ctrl-C to stop (open requests get "
            f"{o.shutdown_timeout:.0f} s to finish; Ctrl-C again to stop at once)"
        )

    def _watch(self) -> None:
        while not self.stop_requested.wait(0.2):
            exited = self.supervisor.first_exited()
            if exited is not None:
                raise ChildExited(exited)

    def _shutdown(self) -> None:
        say = self.supervisor.say
        if self.gateways:
            say(f"stopping: draining the gateway(s) (up to {self.options.shutdown_timeout:.0f} s)")
            drain_s = self.options.shutdown_timeout + ABORT_GRACE_S + GATEWAY_EXIT_MARGIN_S
            self.supervisor.stop(self.gateways, drain_s)
        if self.engine:
            say("stopping: the scheduler and workers")
            self.supervisor.stop(list(reversed(self.engine)), ENGINE_STOP_TIMEOUT_S)
        if self.redis:
            self.supervisor.stop(self.redis, REDIS_STOP_TIMEOUT_S)
        self.supervisor.kill_all()  # anything started and not yet stopped
        if self._redis_dir is not None:
            self._redis_dir.cleanup()
        say("stopped")
