"""The processes of one `pagedserve serve`, started in dependency order, watched, and stopped
in drain order: gateways first (they finish or abort open requests), then the engine, then
Redis. Signals only set flags here; all the work happens on the main thread.

While serving, a child that dies is restarted after a backoff (`restart_policy.py`) and
everything else keeps serving: the scheduler with the same engine id (it resumes its
un-ACKed requests from Redis), a worker (it says hello; the scheduler recomputes what the lost
step held), Redis on the same port (the gateways re-queue what it lost), a gateway replica on
its port under a new id. With tensor parallelism the worker ranks restart together: the
survivors of a dead rank are stuck in its collectives. A crash loop stops everything (exit 1).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

import redis

from pagedserve.services.cli.discovery import (
    Deployment,
    DiscoveryError,
    announce,
    process_start_time,
    withdraw,
)
from pagedserve.services.cli.health_probe import check_gateway
from pagedserve.services.cli.launch_plan import (
    LOOPBACK,
    LaunchPlan,
    Ports,
    ServeOptions,
    gateway_spec,
    plan_launch,
)
from pagedserve.services.cli.redis_launcher import find_redis_server, redis_server_command
from pagedserve.services.cli.restart_counts import RestartCounts
from pagedserve.services.cli.restart_policy import CrashLoopError, RestartPolicy
from pagedserve.services.cli.signal_flag import SignalFlag
from pagedserve.services.cli.supervisor import Child, ChildExited, ChildSpec, Supervisor
from pagedserve.services.gateway.drain import ABORT_GRACE_S
from pagedserve.shared.redis_client import RedisTarget, sync_redis
from pagedserve.shared.transport import private_socket_dir

ENGINE_STOP_TIMEOUT_S = 15.0  # scheduler (its own drain: 5 s) and workers
REDIS_STOP_TIMEOUT_S = 5.0
GATEWAY_EXIT_MARGIN_S = 10.0  # beyond the drain itself: uvicorn closing, Redis clean-up
RANK_STOP_TIMEOUT_S = 5.0  # a surviving TP rank stopped so that all ranks restart together
WATCH_INTERVAL_S = 0.2


@dataclass
class PendingRestart:
    child: Child  # exited
    due: float  # monotonic time of the restart


class LocalCluster:
    def __init__(self, options: ServeOptions, ports: Ports, out: TextIO = sys.stderr) -> None:
        self.options = options
        self.ports = ports
        self.supervisor = Supervisor(out)
        self.stop_requested = SignalFlag()  # raised by the signal handler (see signal_flag)
        self.redis: list[Child] = []
        self.engine: list[Child] = []
        self.gateways: list[Child] = []
        self._redis_dir: tempfile.TemporaryDirectory[str] | None = None
        self.socket_dir: str | None = None  # the engine's private ipc:// sockets
        self._discovery_file: Path | None = None
        self._num_signals = 0
        self._model_dir = ""
        self.policy = RestartPolicy()
        self.restart_counts = RestartCounts(self.redis_url, options.namespace)
        self.pending: list[PendingRestart] = []

    @property
    def redis_url(self) -> str:
        return self.options.redis_url or f"redis://{LOOPBACK}:{self.ports.redis}/0"

    @property
    def gateway_urls(self) -> list[str]:
        host = LOOPBACK if self.options.host in ("0.0.0.0", "::", "") else self.options.host
        return [f"http://{host}:{p}" for p in self.ports.gateway_ports(self.options)]

    def run(self, model_dir: str) -> int:
        """Start everything, serve until a signal (0), a death during start-up or a crash loop
        (1), stop everything."""
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
        except (TimeoutError, CrashLoopError) as exc:
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
        self._model_dir = model_dir
        if self.options.redis_url is None:
            self._redis_dir = tempfile.TemporaryDirectory(prefix="pagedserve-redis-")
            argv = redis_server_command(find_redis_server(), self.ports.redis, self._redis_dir.name)
            self.redis = [self.supervisor.start(ChildSpec("redis", argv))]
        if not self.supervisor.wait_until(
            f"Redis at {self.redis_url} answering PING", self._redis_answers, 10, stop
        ):
            return False
        self.socket_dir = private_socket_dir()
        plan: LaunchPlan = plan_launch(
            self.options, model_dir, self.redis_url, self.ports, self.socket_dir
        )
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
        client = sync_redis(
            RedisTarget(self.redis_url), socket_connect_timeout=0.5, socket_timeout=0.5
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
        try:
            self._discovery_file = announce(self._deployment())
            say("(or `pagedserve queue` on this machine: it finds this deployment)")
        except (OSError, DiscoveryError) as exc:
            say(f"warning: `pagedserve queue` will not find this deployment by itself: {exc}")
        say(
            "press Ctrl-C to stop (open requests get "
            f"{o.shutdown_timeout:.0f} s to finish; Ctrl-C again to stop at once)"
        )

    def _deployment(self) -> Deployment:
        pid = os.getpid()
        start_time = process_start_time(pid)
        assert start_time is not None  # we are running
        return Deployment(
            pid=pid,
            start_time=start_time,
            ports=self.ports.gateway_ports(self.options),
            redis_url=self.redis_url,
            namespace=self.options.namespace,
            model=self.options.served_model_name or self.options.model,
        )

    def _watch(self) -> None:
        self.restart_counts.publish_pending()
        while not self.stop_requested.wait(WATCH_INTERVAL_S):
            for child in self.supervisor.children:
                if child.poll() is not None and not self._is_pending(child):
                    self._on_death(child)
            self._restart_due()
            self.restart_counts.publish_pending()

    def _is_pending(self, child: Child) -> bool:
        return any(p.child is child for p in self.pending)

    def _on_death(self, child: Child) -> None:
        """Report the death and schedule the restart (of every TP rank, for a worker)."""
        self.supervisor.reap(child)
        self.supervisor.say(f"{child.report()}")
        delay = self.policy.on_death(child.name, time.monotonic())  # or CrashLoopError
        due = time.monotonic() + delay
        for rank in self._ranks_to_restart_with(child):
            self.supervisor.say(f"stopping {rank.name}: tensor-parallel ranks restart together")
            self.supervisor.stop([rank], RANK_STOP_TIMEOUT_S)
            self.pending.append(PendingRestart(rank, due))
        self.pending.append(PendingRestart(child, due))
        self.supervisor.say(f"restarting {child.name} in {delay:.1f} s")

    def _ranks_to_restart_with(self, child: Child) -> list[Child]:
        workers = self.engine[1:]
        if child not in workers:
            return []
        return [w for w in workers if w is not child and not self._is_pending(w)]

    def _restart_due(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self.pending if p.due <= now]:
            self.pending.remove(pending)
            old = pending.child
            self.restart_counts.add(old.name)
            new = self.supervisor.restart(old, self._respawn_spec(old))
            for role in (self.redis, self.engine, self.gateways):
                if old in role:
                    role[role.index(old)] = new
            self.supervisor.say(
                f"restarted {new.name} (pid {new.pid}; restart number "
                f"{self.restart_counts.counts[new.name]})"
            )

    def _respawn_spec(self, child: Child) -> ChildSpec:
        if child not in self.gateways:
            return child.spec
        index = self.gateways.index(child)
        port = self.ports.gateway_ports(self.options)[index]
        generation = self.restart_counts.counts[child.name]
        return gateway_spec(self.options, self._model_dir, self.redis_url, port, index, generation)

    def _shutdown(self) -> None:
        say = self.supervisor.say
        if self._discovery_file is not None:
            withdraw(self._discovery_file)
        # A child awaiting its restart is dead and reaped: its pid (and group) may be reused.
        gateways, engine, redis_ = (
            [c for c in role if not self._is_pending(c)]
            for role in (self.gateways, self.engine, self.redis)
        )
        if gateways:
            say(f"stopping: draining the gateway(s) (up to {self.options.shutdown_timeout:.0f} s)")
            drain_s = self.options.shutdown_timeout + ABORT_GRACE_S + GATEWAY_EXIT_MARGIN_S
            self.supervisor.stop(gateways, drain_s)
        if engine:
            say("stopping: the scheduler and workers")
            self.supervisor.stop(list(reversed(engine)), ENGINE_STOP_TIMEOUT_S)
        if redis_:
            self.supervisor.stop(redis_, REDIS_STOP_TIMEOUT_S)
        self.supervisor.kill_all()  # anything started and not yet stopped
        if self._redis_dir is not None:
            self._redis_dir.cleanup()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        say("stopped")
