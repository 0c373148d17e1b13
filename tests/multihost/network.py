"""Hosts made of Linux network namespaces, on one machine: each host is a namespace with its
own loopback and one interface (`eth0`) with its own address, its veth peer plugged into a
bridge that lives in a namespace of its own (the switch), so no address of the machine itself
takes part. Processes started on a host also get a UTS namespace named after it, so
`socket.gethostname()` there is the host's name, as on separate machines.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `tear_down` removes every
namespace this network made (the kernel ends the veth pairs with them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

# A private /24 that only these namespaces use: no route leads out of them.
SUBNET = "10.199.35"
PREFIX_LEN = 24


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _ip_tc(netns: str, *args: str) -> None:
    done = subprocess.run(["ip", "netns", "exec", netns, "tc", *args], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")


def can_build_hosts() -> str | None:
    """None when this machine can build namespace hosts, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2 / util-linux)"
    return None


@dataclass
class Host:
    name: str  # the host name its processes see
    netns: str  # the namespace's name
    address: str
    switch: str  # the switch's namespace
    switch_port: str  # the bridge port its link plugs into

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run on this host, under its host name."""
        set_name = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--",
                "sh", "-c", set_name, self.name, *argv]  # fmt: skip

    def run(self, argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def set_link(self, up: bool) -> None:
        _ip("-n", self.netns, "link", "set", "eth0", "up" if up else "down")

    def slow_inbound(self, rate: str | None) -> None:
        """Throttle what the switch sends to this host to `rate` (a token bucket whose queue
        drops what waits over 400 ms: a congested link); None: back to full speed, dropping
        whatever still waits."""
        dev = ("dev", self.switch_port)
        if rate is None:
            _ip_tc(self.switch, "qdisc", "del", *dev, "root")
            return
        _ip_tc(self.switch, "qdisc", "add", *dev, "root", "tbf", "rate", rate,
               "burst", "1600", "latency", "400ms")  # fmt: skip

    def pids(self) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", self.netns).split()]

    def kill_everything(self) -> int:
        """SIGKILL every process in this host's namespace (a power cut); how many there were."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


@dataclass
class Network:
    """Hosts on one bridge; `prefix` keeps concurrent runs' namespaces apart."""

    prefix: str = field(default_factory=lambda: f"ps{os.getpid() % 100000}")
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-switch"

    def build(self, names: Sequence[str]) -> Network:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for index, name in enumerate(names, start=1):
            self.hosts[name] = self._add_host(name, index)
        return self

    def _add_host(self, name: str, index: int) -> Host:
        port = f"p{index}"
        host = Host(name, f"{self.prefix}-{name}", f"{SUBNET}.{index}", self.switch, port)
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("link", "add", f"{self.prefix}h{index}", "type", "veth", "peer", "name",
            f"{self.prefix}s{index}")  # fmt: skip
        _ip("link", "set", f"{self.prefix}h{index}", "netns", host.netns)
        _ip("link", "set", f"{self.prefix}s{index}", "netns", self.switch)
        _ip("-n", host.netns, "link", "set", f"{self.prefix}h{index}", "name", "eth0")
        _ip("-n", self.switch, "link", "set", f"{self.prefix}s{index}", "name", port)
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        return host

    def tear_down(self) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(RuntimeError):
                host.kill_everything()
        for netns in [h.netns for h in self.hosts.values()] + [self.switch]:
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", netns)
        self.hosts.clear()
