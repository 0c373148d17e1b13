"""Free TCP ports on loopback, for the processes that `pagedserve serve` starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on right now. Another process may take it before ours
    binds; the supervisor reports that as a child that failed to start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `port` now (as servers do, with SO_REUSEADDR, so that
    connections of a previous run in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port_run(count: int, host: str = "127.0.0.1", attempts: int = 100) -> int:
    """The first of `count` consecutive ports that nothing listens on or holds right now (a
    gateway per port from `--port` up, as `pagedserve serve --num-gateways` takes them). A port
    next to a free one may be any process's outgoing connection; such runs are skipped.
    RuntimeError after `attempts` tries."""
    for _ in range(attempts):
        first = free_port(host)
        if first + count - 1 < 65536 and all(is_port_free(first + i, host) for i in range(count)):
            return first
    raise RuntimeError(f"no run of {count} free ports on {host} in {attempts} tries")
