"""The supervisor with real child processes: ready lines, death reports, stopping, and no
orphan when the supervisor itself is SIGKILLed."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from pagedserve.services.cli.supervisor import ChildExited, ChildSpec, Supervisor


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not reaped) is not running.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def supervisor():
    sup = Supervisor(io.StringIO())
    yield sup
    sup.kill_all()


def test_ready_line_and_prefixed_output(supervisor: Supervisor) -> None:
    child = supervisor.start(
        ChildSpec(
            "svc",
            python("import time; print('loading'); print('svc ready', flush=True); time.sleep(30)"),
            ready_line="svc ready",
        )
    )
    assert supervisor.wait_until("svc ready", child.ready.is_set, 20)
    assert "       svc | loading" in supervisor.out.getvalue()
    assert list(child.tail) == ["loading", "svc ready"]


def test_a_dying_child_is_reported_with_code_and_last_lines(supervisor: Supervisor) -> None:
    code = "import sys; [print(f'line {i}') for i in range(50)]; sys.exit(3)"
    supervisor.start(ChildSpec("crasher", python(code), ready_line="never"))
    with pytest.raises(ChildExited) as exited:
        supervisor.wait_until("crasher ready", lambda: False, 20)
    report = str(exited.value)
    assert "crasher (pid" in report and "exited with code 3" in report
    assert "line 49" in report and "line 19" not in report  # the last 30 lines only


def test_a_killed_child_names_the_signal(supervisor: Supervisor) -> None:
    child = supervisor.start(ChildSpec("victim", python("import time; time.sleep(30)")))
    os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(ChildExited, match=r"victim .* was killed by signal 9"):
        supervisor.wait_until("never", lambda: False, 20)


def test_timeout_names_what_was_awaited(supervisor: Supervisor) -> None:
    supervisor.start(ChildSpec("slow", python("import time; time.sleep(30)")))
    with pytest.raises(TimeoutError, match="the slow thing did not happen within 0 s"):
        supervisor.wait_until("the slow thing", lambda: False, 0.2)


def test_stop_escalates_to_sigkill_and_reaps_the_group(supervisor: Supervisor) -> None:
    # The child ignores SIGTERM and has a grandchild in its process group.
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('grandchild', p.pid, flush=True); time.sleep(60)"
    )
    child = supervisor.start(ChildSpec("stubborn", python(code), ready_line="grandchild"))
    supervisor.wait_until("grandchild", child.ready.is_set, 20)
    grandchild = int(child.tail[-1].split()[1])
    started = time.monotonic()
    supervisor.stop([child], timeout_s=0.5)
    assert 0.4 < time.monotonic() - started < 5
    assert child.poll() == -signal.SIGKILL
    assert wait_gone(grandchild)
    assert "still running 0 s after SIGTERM: killing it" in supervisor.out.getvalue()


def test_children_die_with_a_sigkilled_supervisor(tmp_path) -> None:
    """PR_SET_PDEATHSIG through child_guard: no orphan even without any clean-up."""
    script = (
        "import io, sys, time\n"
        "from services.cli.supervisor import ChildSpec, Supervisor\n"
        "sup = Supervisor(io.StringIO())\n"
        "argv = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "child = sup.start(ChildSpec('sleeper', argv))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        child_pid = int(parent.stdout.readline())
        time.sleep(0.5)  # let child_guard exec the sleeper
        assert is_running(child_pid)
        assert os.getpgid(child_pid) == child_pid  # its own process group
        parent.kill()
        parent.wait()
        assert wait_gone(child_pid), "the child outlived its SIGKILLed supervisor"
    finally:
        parent.kill()
        parent.stdout.close()
