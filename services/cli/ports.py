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
