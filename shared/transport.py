"""Typed ZeroMQ sockets between one scheduler and its workers, carrying `shared.protocol`
messages encoded with `encode` / `decode` (msgpack, never pickle).

    scheduler  PlanPublisher (PUB, bind)   --plans, heartbeats, Shutdown-->  PlanSubscriber (SUB)
    scheduler  ResultPuller  (PULL, bind)  <--hello, results, heartbeats--  ResultPusher   (PUSH)

Every socket has LINGER 0 (closing never hangs on unsent messages). The plan publisher has
SNDHWM 0 (no high-water mark): a PUB socket silently drops messages for a subscriber whose
queue is full, and a dropped plan would desynchronise a worker, so the queue is unbounded
instead. PUB/SUB has a slow-joiner gap (a subscriber misses what was published before its
subscription reached the publisher); the handshake closes it: the scheduler publishes a
heartbeat every second, and a worker says hello only after it has *received* one, so no plan is
published before every worker can see it.

This is the one module of `shared/` that imports pyzmq. `LoopResultPuller` and
`LoopPlanPublisher` are for the scheduler's asyncio loop; the worker uses the blocking ones.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

import zmq

from pagedserve.shared.protocol import ProtocolError, decode, encode

logger = logging.getLogger(__name__)

MAX_IPC_PATH_BYTES = 107  # sun_path is 108 bytes with its terminating NUL


class TransportError(RuntimeError):
    """A message of the wrong type arrived where a protocol message was expected."""


def private_socket_dir(prefix: str = "pagedserve-zmq-") -> str:
    """A new directory only this user can enter (0700), for ipc:// sockets: a local process of
    another user cannot connect to a socket inside it, so cannot read the plans' token ids.
    The caller removes it."""
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, stat.S_IRWXU)  # mkdtemp makes it 0700 already; say it here too
    return path


def ipc_address(socket_dir: str, name: str) -> str:
    """`ipc://<socket_dir>/<name>.sock`; a Unix socket path must fit in 107 bytes."""
    path = os.path.join(socket_dir, f"{name}.sock")
    if len(path.encode()) > MAX_IPC_PATH_BYTES:
        raise ValueError(
            f"ipc socket path {path!r} is {len(path.encode())} bytes, over the "
            f"{MAX_IPC_PATH_BYTES} a Unix socket allows: use a shorter TMPDIR"
        )
    return f"ipc://{path}"


def _configure(socket: zmq.Socket, *, sndhwm: int | None = None) -> None:
    socket.setsockopt(zmq.LINGER, 0)
    if sndhwm is not None:
        socket.setsockopt(zmq.SNDHWM, sndhwm)


def _decode(frame: bytes) -> Any:
    try:
        return decode(frame)
    except ProtocolError as exc:
        raise TransportError(f"undecodable message ({len(frame)} bytes): {exc}") from exc


class _Endpoint:
    """One socket of a given type, bound or connected, closed with its owner."""

    def __init__(
        self,
        context: zmq.Context,
        socket_type: int,
        address: str,
        *,
        bind: bool,
        sndhwm: int | None = None,
    ) -> None:
        self.address = address
        self.socket = context.socket(socket_type)
        _configure(self.socket, sndhwm=sndhwm)
        if socket_type == zmq.SUB:
            self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            if bind:
                self.socket.bind(address)
            else:
                self.socket.connect(address)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            verb = "bind" if bind else "connect"
            raise TransportError(f"cannot {verb} {address}: {exc}") from exc

    @property
    def endpoint(self) -> str:
        """The address actually bound or connected (resolves a `tcp://host:*` wildcard port)."""
        return self.socket.getsockopt(zmq.LAST_ENDPOINT).decode()

    def close(self) -> None:
        self.socket.close(linger=0)

    def __enter__(self) -> _Endpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Blocking sockets (workers, tests)


class _BlockingSender(_Endpoint):
    def send(self, message: Any) -> None:
        self.socket.send(encode(message), copy=False)


class _BlockingReceiver(_Endpoint):
    def recv(self, timeout_s: float | None = None) -> Any | None:
        """The next message, or None if none arrives within `timeout_s` (None: wait forever)."""
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return _decode(self.socket.recv(copy=True))


class PlanPublisher(_BlockingSender):
    """Scheduler side of the plan channel (PUB, binds)."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        super().__init__(context, zmq.PUB, address, bind=True, sndhwm=0)


class PlanSubscriber(_BlockingReceiver):
    """Worker side of the plan channel (SUB to everything, connects)."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        super().__init__(context, zmq.SUB, address, bind=False)
        self.socket.setsockopt(zmq.RCVHWM, 0)


class ResultPusher(_BlockingSender):
    """Worker side of the result channel (PUSH, connects). SNDHWM 0: a result is never
    dropped or blocked on while the scheduler is briefly away."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        super().__init__(context, zmq.PUSH, address, bind=False, sndhwm=0)


class ResultPuller(_BlockingReceiver):
    """Scheduler side of the result channel (PULL, binds), blocking flavour."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        super().__init__(context, zmq.PULL, address, bind=True)


# ---------------------------------------------------------------------------------------------
# Sockets driven by an asyncio loop (the scheduler)


class LoopPlanPublisher(PlanPublisher):
    """`PlanPublisher` for an event loop: a PUB socket with no high-water mark never blocks,
    so `send` with NOBLOCK is a plain call that does not wait."""

    def send(self, message: Any) -> None:
        try:
            self.socket.send(encode(message), flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            raise TransportError(f"send on {self.address} failed: {exc}") from exc


class LoopResultPuller(_Endpoint):
    """`ResultPuller` read from the event loop's own reader callback: every message is handed
    to `on_message` in the loop turn its socket becomes readable, with no task, future or poll
    per message (pyzmq's asyncio sockets make several: the scheduler's CPU per step went down
    by 0.1-0.35 ms with this, `benchmarks.scheduler_loop_cpu`).

    ZeroMQ's descriptor signals that the socket's events may have changed, not that a message
    waits, and it does not signal again for messages already queued: so each wake-up reads
    until the socket says nothing is left, and an undecodable message or a failing handler is
    logged and skipped, never left to strand the ones behind it."""

    def __init__(self, context: zmq.Context, address: str) -> None:
        super().__init__(context, zmq.PULL, address, bind=True)  # no blocking recv to mix in
        self._fd = self.socket.getsockopt(zmq.FD)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start_reading(self, on_message: Callable[[Any], None]) -> None:
        """Hand every message to `on_message` from now on (in the running loop) until closed."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._drain, on_message)
        self._drain(on_message)  # what arrived before the reader was added

    def _drain(self, on_message: Callable[[Any], None]) -> None:
        while self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frame = self.socket.recv(zmq.NOBLOCK)
            try:
                on_message(_decode(frame))
            except TransportError as exc:
                logger.error("dropping a message on %s: %s", self.address, exc)
            except Exception:
                logger.exception("handling a message on %s failed", self.address)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._loop = None
        super().close()
