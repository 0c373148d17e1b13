"""The engine processes' command lines: bad flags and taken ports end with a clear message and
a non-zero exit, never a hang or a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.integration.processes import REPO_ROOT

pytestmark = pytest.mark.integration


def run(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_scheduler_refuses_a_bad_bound_from_a_flag_or_the_environment():
    result = run("pagedserve.services.scheduler", "--max-num-seqs", "0")
    assert result.returncode == 2
    assert "max_num_seqs must be >= 1, got 0" in result.stderr
    result = run("pagedserve.services.scheduler", env={"PAGEDSERVE_BLOCK_SIZE": "12"})
    assert result.returncode == 2
    assert "block_size must be a power of two >= 1, got 12" in result.stderr


def test_scheduler_refuses_an_unknown_policy():
    result = run("pagedserve.services.scheduler", "--policy", "lifo")
    assert result.returncode == 2 and "invalid choice: 'lifo'" in result.stderr


def test_scheduler_names_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(
            "pagedserve.services.scheduler", "--plan-port", str(port), "--result-port", "0"
        )
    assert result.returncode == 1
    assert f"cannot bind tcp://127.0.0.1:{port}" in result.stderr


def test_worker_refuses_a_rank_outside_the_group():
    result = run("pagedserve.services.gpu_worker", "--rank", "2", "--tensor-parallel-size", "2")
    assert result.returncode == 2
    assert "--rank must be in [0, --tensor-parallel-size=2), got 2" in result.stderr
