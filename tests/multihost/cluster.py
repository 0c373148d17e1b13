"""pagedserve across hosts (tests/multihost/network.py), every process the real one:

- `redis`: the Redis primary; `redis-replica`: its replica; `sentinel-1..3`: one sentinel
  each (quorum 2). Everything reaches Redis through the sentinels (`--redis-sentinel`).
- `engine-a`, `engine-b`: a scheduler and one CPU worker each (one torch thread), on the tiny
  served model; scheduler and worker meet on the host's loopback, as in one pod.
- `gateways`: two gateways on the host's address, ports 8000 and 8001.
- `client`: where the load (`load_client.py`), `pagedserve queue` and Redis look-ups run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.redis_sentinel import SERVICE_NAME, redis_argv, sentinel_argv, sentinel_option
from tests.integration.conftest import redis_server_binary
from tests.integration.pipeline.served_model import MAX_MODEL_LEN
from tests.integration.processes import REPO_ROOT
from tests.multihost.network import Host, Network

HOSTS = ("redis", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3",
         "engine-a", "engine-b", "gateways", "client")  # fmt: skip
ENGINES = {"engine-a": "engine0", "engine-b": "engine1"}  # host: engine id
REDIS_PORT = 6379
SENTINEL_PORT = 26379
GATEWAY_PORTS = (8000, 8001)
NAMESPACE = "multihost"
MODEL_NAME = "tiny"
NUM_BLOCKS = 192
PAGEDSERVE = str(Path(sys.executable).with_name("pagedserve"))
LOAD_CLIENT = str(Path(__file__).with_name("load_client.py"))


class HostProcess:
    """One process on one host, its output in a log file; `kill` is SIGKILL to its group."""

    def __init__(self, host: Host, name: str, argv: list[str], log_dir: Path, env: dict):
        self.host, self.name = host, name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                host.command(argv), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, start_new_session=True,
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not log {text!r}:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@dataclass
class LoadRun:
    """A load client running on the client host."""

    process: subprocess.Popen[bytes]
    progress_file: Path
    stop_file: Path
    results_file: Path
    ready_file: Path  # the client is up (and, if told to, waits for `go`)
    go_file: Path

    def go(self) -> None:
        self.go_file.touch()

    @property
    def num_pieces(self) -> int:
        if not self.progress_file.exists():
            return 0
        return len(self.progress_file.read_text().splitlines())

    def stop(self) -> None:
        self.stop_file.touch()

    def results(self, timeout_s: float = 300) -> list[dict]:
        """Wait for the client to finish; what every request saw."""
        if self.process.wait(timeout=timeout_s) != 0:
            log = self.results_file.with_name(self.stop_file.stem + ".log")
            raise RuntimeError(f"load client failed: {log.read_text(errors='replace')[-3000:]}")
        return json.loads(self.results_file.read_text())


class MultiHost:
    def __init__(self, work_dir: Path, model_dir: Path) -> None:
        self.work_dir, self.model_dir = work_dir, model_dir
        self.network = Network()
        self.processes: dict[str, HostProcess] = {}
        self.num_loads = 0

    def host(self, name: str) -> Host:
        return self.network.hosts[name]

    @property
    def sentinel(self) -> str:
        return sentinel_option(
            [(self.host(f"sentinel-{i}").address, SENTINEL_PORT) for i in (1, 2, 3)]
        )

    @property
    def base_urls(self) -> list[str]:
        return [f"http://{self.host('gateways').address}:{port}" for port in GATEWAY_PORTS]

    # -- starting ------------------------------------------------------------------------------

    def start(self) -> MultiHost:
        self.network.build(HOSTS)
        self._start_redis()
        for host, engine_id in ENGINES.items():
            self._start_engine(host, engine_id)
        for index, port in enumerate(GATEWAY_PORTS):
            self._start_gateway(index, port)
        for name, process in self.processes.items():
            if name.startswith("scheduler"):
                process.wait_for_log("scheduler ready", 180)
            elif name.startswith("worker"):
                process.wait_for_log("worker 0 ready", 300)
        return self

    def spawn(self, host: str, name: str, argv: list[str], env: dict | None = None) -> None:
        self.processes[name] = HostProcess(self.host(host), name, argv, self.work_dir, env or {})

    def _start_redis(self) -> None:
        binary = redis_server_binary()
        primary = (self.host("redis").address, REDIS_PORT)
        for name, replica_of in (("redis", None), ("redis-replica", primary)):
            data = self._data_dir(name)
            # loopback too: the host itself can still be asked once its link is down
            addresses = [self.host(name).address, "127.0.0.1"]
            argv = redis_argv(binary, addresses, REDIS_PORT, data, replica_of)
            self.spawn(name, name, argv)
        for i in (1, 2, 3):
            host = self.host(f"sentinel-{i}")
            data = self._data_dir(host.name)
            argv = sentinel_argv(binary, host.address, SENTINEL_PORT, data, primary, quorum=2)
            self.spawn(host.name, host.name, argv)
        self.wait_until("the replica and 3 sentinels known", self._redis_tier_ready, 60)

    def _data_dir(self, name: str) -> Path:
        path = self.work_dir / f"data-{name}"
        path.mkdir(exist_ok=True)
        return path

    def _start_engine(self, host: str, engine_id: str) -> None:
        self.spawn(host, f"scheduler-{engine_id}", [
            sys.executable, "-P", "-m", "pagedserve.services.scheduler",
            "--redis-sentinel", self.sentinel, "--namespace", NAMESPACE, "--engine-id", engine_id,
            "--worker-timeout", "5", "--max-num-seqs", "64", "--max-num-batched-tokens", "512",
        ])  # fmt: skip
        self.spawn(host, f"worker-{engine_id}", [
            sys.executable, "-P", "-m", "pagedserve.services.gpu_worker",
            "--model", str(self.model_dir), "--device", "cpu", "--dtype", "float32",
            "--num-blocks", str(NUM_BLOCKS), "--scheduler-timeout", "5",
        ], env={"OMP_NUM_THREADS": "1"})  # fmt: skip

    def _start_gateway(self, index: int, port: int) -> None:
        self.spawn("gateways", f"gateway-{index}", [
            sys.executable, "-P", "-m", "pagedserve.services.gateway",
            "--model", str(self.model_dir), "--served-model-name", MODEL_NAME,
            "--redis-sentinel", self.sentinel, "--namespace", NAMESPACE,
            "--host", self.host("gateways").address, "--port", str(port),
            "--gateway-id", f"gw-{index}", "--max-model-len", str(MAX_MODEL_LEN),
        ])  # fmt: skip

    def pause_schedulers(self, paused: bool, engine_ids: tuple[str, ...] = ()) -> None:
        """SIGSTOP (or SIGCONT) schedulers (default: both): engines stalled, reading nothing
        new, their delivered requests still pending."""
        for engine_id in engine_ids or tuple(ENGINES.values()):
            process = self.processes[f"scheduler-{engine_id}"].process
            if process.poll() is None:
                os.kill(process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def pending(self) -> dict[str, int]:
        """Delivered, un-ACKed requests per engine (the consumer group's view)."""
        done = self.queue("--json")
        if done.returncode != 0:
            return {}
        return {c["name"]: c["pending"] for c in json.loads(done.stdout)["consumers"]}

    def stop(self) -> None:
        self.pause_schedulers(False)
        for process in self.processes.values():
            process.stop()
        self.network.tear_down()

    # -- looking ---------------------------------------------------------------------------------

    def redis_cli(self, address: str, port: int, *command: str, on: str = "client") -> str:
        cli = shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))
        done = self.host(on).run([cli, "-h", address, "-p", str(port), *command], timeout_s=10)
        return done.stdout.strip()

    def info(self, host: str, on: str = "client") -> dict[str, str]:
        """`INFO replication` of the Redis on `host`, as a dict ({} if it does not answer)."""
        address = "127.0.0.1" if on == host else self.host(host).address
        text = self.redis_cli(address, REDIS_PORT, "INFO", "replication", on=on)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def primary_address(self) -> str:
        """The primary's address as the first answering sentinel names it."""
        for i in (1, 2, 3):
            sentinel = self.host(f"sentinel-{i}").address
            ask = ("SENTINEL", "get-master-addr-by-name", SERVICE_NAME)
            answer = self.redis_cli(sentinel, SENTINEL_PORT, *ask)
            if answer:
                return answer.splitlines()[0]
        return ""

    def _redis_tier_ready(self) -> bool:
        if self.info("redis-replica").get("master_link_status") != "up":
            return False
        master = self.redis_cli(self.host("sentinel-1").address, SENTINEL_PORT,
                                "SENTINEL", "master", SERVICE_NAME).splitlines()  # fmt: skip
        fields = dict(zip(master[::2], master[1::2], strict=False))
        return fields.get("num-slaves") == "1" and fields.get("num-other-sentinels") == "2"

    def queue(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`pagedserve queue` run on the client host, through the sentinels."""
        argv = [PAGEDSERVE, "queue", "--redis-sentinel", self.sentinel, "--namespace", NAMESPACE]
        return self.host("client").run([*argv, *args], timeout_s=60)

    def engines(self) -> dict[str, dict]:
        done = self.queue("--json")
        if done.returncode != 0:
            return {}
        return {e["engine_id"]: e for e in json.loads(done.stdout)["engines"]}

    def wait_until(self, what: str, condition, timeout_s: float) -> float:
        start = time.monotonic()
        while not condition():
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"{what}: not within {timeout_s} s")
            time.sleep(0.2)
        return time.monotonic() - start

    # -- load ------------------------------------------------------------------------------------

    def load(self, prompts: list[str], max_tokens: int, concurrency: int,
             num_requests: int = 10**6, deadline_s: float = 240,
             wait_for_go: bool = False) -> LoadRun:  # fmt: skip
        self.num_loads += 1
        base = self.work_dir / f"load-{self.num_loads}"
        run = LoadRun(None, *(base.with_suffix(s) for s in  # type: ignore[arg-type]
                      (".progress", ".stop", ".results.json", ".ready", ".go")))  # fmt: skip
        config = {"base_urls": self.base_urls, "model": MODEL_NAME, "prompts": prompts,
                  "max_tokens": max_tokens, "concurrency": concurrency,
                  "num_requests": num_requests, "deadline_s": deadline_s,
                  "stop_file": str(run.stop_file),
                  "progress_file": str(run.progress_file),
                  "ready_file": str(run.ready_file),
                  "go_file": str(run.go_file) if wait_for_go else None}  # fmt: skip
        config_file = base.with_suffix(".json")
        config_file.write_text(json.dumps(config))
        argv = [sys.executable, "-P", LOAD_CLIENT, str(config_file), str(run.results_file)]
        with base.with_suffix(".log").open("wb") as log:
            run.process = subprocess.Popen(
                self.host("client").command(argv), stdout=log, stderr=subprocess.STDOUT
            )
        return run
