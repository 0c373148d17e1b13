"""ipc:// sockets in a private directory: what `pagedserve serve` uses between its scheduler
and workers, so that no other local user can read the plans."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import zmq

from pagedserve.shared.transport import (
    PlanPublisher,
    PlanSubscriber,
    ipc_address,
    private_socket_dir,
)


@pytest.fixture
def socket_dir():
    path = private_socket_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_socket_directory_is_private(socket_dir: str) -> None:
    mode = os.stat(socket_dir).st_mode
    assert stat.S_IMODE(mode) == 0o700 and os.stat(socket_dir).st_uid == os.getuid()


def test_plans_travel_over_ipc_in_the_private_directory(socket_dir: str) -> None:
    address = ipc_address(socket_dir, "plan")
    assert address == f"ipc://{socket_dir}/plan.sock"
    context = zmq.Context()
    try:
        with PlanPublisher(context, address) as pub, PlanSubscriber(context, address) as sub:
            message = None
            for _ in range(100):  # the slow-joiner gap: publish until the subscription lands
                pub.send({"plan": [1, 2, 3]})
                message = sub.recv(timeout_s=0.05)
                if message is not None:
                    break
            assert message == {"plan": [1, 2, 3]}
            assert os.path.exists(os.path.join(socket_dir, "plan.sock"))
    finally:
        context.term()


def test_a_path_too_long_for_a_unix_socket_is_refused() -> None:
    with pytest.raises(ValueError, match="over the 107 a Unix socket allows"):
        ipc_address("/tmp/" + "d" * 110, "plan")
