"""`LocalCluster`'s watch loop heals: real (sleeping) child processes stand in for the services;
a killed one is restarted while the others keep running, TP ranks restart together, a crash
loop stops, and the restart counts reach Redis for /metrics."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from pagedserve.services.cli.launch_plan import Ports, ServeOptions
from pagedserve.services.cli.local_cluster import LocalCluster
from pagedserve.services.cli.redis_launcher import RedisServer
from pagedserve.services.cli.restart_policy import CrashLoopError, RestartPolicy
from pagedserve.services.cli.supervisor import Child, ChildSpec
from pagedserve.shared.keys import RedisKeys

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class Watch:
    """`cluster._watch()` on a thread; what it raised, if anything."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.cluster._watch()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.cluster.stop_requested.set()
        self.thread.join(timeout=10)


@pytest.fixture
def make_cluster(redis_server: RedisServer) -> Iterator[Callable[..., LocalCluster]]:
    made: list[LocalCluster] = []

    def make(tensor_parallel_size: int = 1, **policy: float) -> LocalCluster:
        options = ServeOptions(
            redis_url=redis_server.url, namespace=f"t{len(made)}-{os.getpid()}",
            tensor_parallel_size=tensor_parallel_size,
        )  # fmt: skip
        cluster = LocalCluster(options, Ports(0, 0, 0, 0), out=io.StringIO())
        cluster.policy = RestartPolicy(base_delay_s=0.05, **policy)
        start = cluster.supervisor.start
        cluster.engine = [start(ChildSpec("scheduler", SLEEPER))]
        cluster.engine += [
            start(ChildSpec(f"worker{r}", SLEEPER)) for r in range(tensor_parallel_size)
        ]
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop_requested.set()
        cluster.supervisor.kill_all()


def wait_for(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def running(child: Child) -> bool:
    return child.poll() is None


def test_a_killed_worker_is_restarted_and_the_scheduler_keeps_running(make_cluster) -> None:
    cluster = make_cluster()
    scheduler, worker = cluster.engine
    watch = Watch(cluster)
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: cluster.engine[1] is not worker and running(cluster.engine[1]))
    assert cluster.engine[0] is scheduler and running(scheduler)
    assert [c.name for c in cluster.supervisor.children] == ["scheduler", "worker0"]
    log = cluster.supervisor.out.getvalue()
    assert f"worker0 (pid {worker.pid}) was killed by signal 9" in log
    assert "restarting worker0 in 0.1 s" in log and "restart number 1" in log
    client = redis.Redis.from_url(cluster.redis_url)
    key = RedisKeys(cluster.options.namespace).process_restarts
    wait_for(lambda: client.hgetall(key) == {b"worker0": b"1"})
    client.close()
    watch.stop()
    assert watch.error is None


def test_tensor_parallel_ranks_restart_together(make_cluster) -> None:
    cluster = make_cluster(tensor_parallel_size=2)
    scheduler, rank0, rank1 = cluster.engine
    watch = Watch(cluster)
    os.kill(rank1.pid, signal.SIGKILL)
    wait_for(lambda: all(c not in (rank0, rank1) and running(c) for c in cluster.engine[1:]))
    assert rank0.poll() is not None  # stopped by serve, not left in a broken process group
    assert cluster.engine[0] is scheduler and running(scheduler)
    assert dict(cluster.restart_counts.counts) == {"worker0": 1, "worker1": 1}
    watch.stop()


def test_a_crash_loop_stops_with_the_reason(make_cluster) -> None:
    cluster = make_cluster(max_deaths=3)
    watch = Watch(cluster)
    for _ in range(3):
        current = cluster.engine[0]
        wait_for(lambda c=current: running(c))
        os.kill(current.pid, signal.SIGKILL)
        wait_for(lambda c=current: cluster.engine[0] is not c or watch.error is not None)
    watch.thread.join(timeout=10)
    assert isinstance(watch.error, CrashLoopError)
    assert "scheduler died 3 times within 60 s" in str(watch.error)
    assert running(cluster.engine[1])  # the rest is stopped by run()'s shutdown, not here
