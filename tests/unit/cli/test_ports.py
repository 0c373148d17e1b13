"""Free ports on loopback: one, and runs of consecutive ones (`services/cli/ports.py`)."""

from __future__ import annotations

import socket

import pytest

from pagedserve.services.cli import ports


def test_a_run_whose_next_port_is_held_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        real_free_port = ports.free_port
        offered = iter([taken - 1])  # first a port whose neighbour is held, then real ones
        monkeypatch.setattr(
            ports, "free_port", lambda host: next(offered, None) or real_free_port(host)
        )
        first = ports.free_port_run(2)
        assert first != taken - 1
        assert taken not in (first, first + 1)
        assert ports.is_port_free(first) and ports.is_port_free(first + 1)


def test_no_run_found_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "free_port", lambda host: taken - 1)
        expected = r"no run of 2 free ports on 127\.0\.0\.1 in 3 tries"
        with pytest.raises(RuntimeError, match=expected):
            ports.free_port_run(2, attempts=3)
