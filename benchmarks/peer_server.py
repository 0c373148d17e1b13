"""A peer server the benchmarks start and stop (transformers serve, vLLM's CPU build): its own
process group on a free port, ready once /health answers 200, stopped on exit."""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Self, TextIO

import httpx

from pagedserve.services.cli.ports import free_port
from pagedserve.services.cli.supervisor import ChildSpec, Supervisor


class PeerServer:
    """`with Server(config) as server:` -> `server.base_url`; subclasses say how to start it."""

    name: ClassVar[str]  # the child's name in logs and in the wait's message
    stop_timeout_s: ClassVar[float] = 10.0

    def __init__(self, config: Any, log: TextIO | None = None) -> None:
        self.config = config
        self.port = free_port()
        self.supervisor = Supervisor(out=log or sys.stderr)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def child_spec(self) -> ChildSpec:
        raise NotImplementedError

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> Self:
        try:
            self.supervisor.start(self.child_spec())
            self.supervisor.wait_until(
                f"{self.name} answering /health", self._healthy, self.config.startup_timeout_s
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.supervisor.stop(list(self.supervisor.children), timeout_s=self.stop_timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
