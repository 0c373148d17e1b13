"""Security properties: the API key guards every endpoint but /health (and /metrics unless
`--metrics-require-key`); nothing on the wire is pickled and the codec refuses foreign types;
every service binds to loopback by default on the ports it was given."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import httpx
import msgpack
import pytest

from pagedserve.shared.protocol import Heartbeat, ProtocolError, decode, encode
from tests.integration.pipeline.conftest import wait_until_serving
from tests.integration.processes import REPO_ROOT
from tests.integration.reliability.cluster import add_engine, add_gateway

pytestmark = pytest.mark.integration

API_KEY = "sk-secret-key"
# What would put pickle on the wire or load pickled data: the modules themselves, pyzmq's and
# torch.distributed's object helpers (pickle underneath), torch.load without weights_only.
PICKLE_PATTERNS = re.compile(
    r"\bimport (pickle|marshal|cloudpickle|dill|shelve)\b"
    r"|\bfrom (pickle|marshal|cloudpickle|dill)\b|\b(pickle|marshal|cloudpickle|dill)\."
    r"|\b(send|recv)_pyobj\b|_object_list\b"
    r"|\b(all_)?gather_object\b|\btorch\.load\(|allow_pickle\s*=\s*True"
)


def test_no_pickle_or_marshal_anywhere_in_services_or_shared() -> None:
    offenders = []
    for root in ("services", "shared", "kernels"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                code = line.split("#", 1)[0]
                if PICKLE_PATTERNS.search(code):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_pattern_would_catch_pickle() -> None:  # the grep above can fail
    for line in ("import pickle", "socket.send_pyobj(x)", "dist.broadcast_object_list(x)",
                 "state = torch.load(path)", "from marshal import loads"):  # fmt: skip
        assert PICKLE_PATTERNS.search(line), line


@pytest.mark.parametrize(
    "payload",
    [
        msgpack.packb(msgpack.ExtType(99, b"\x90")),  # unknown tag
        msgpack.packb(msgpack.ExtType(0, b"\x90")),  # tag 0 is not a message
        msgpack.packb(msgpack.ExtType(127, b"\x90")),  # the highest application tag
        msgpack.packb([msgpack.ExtType(100, b"")]),  # nested
        msgpack.packb(msgpack.ExtType(12, msgpack.packb(["too", "few"]))),  # wrong field count
        msgpack.packb(msgpack.ExtType(12, b"\xc1")),  # garbage inside a known tag
    ],
)
def test_the_codec_rejects_foreign_extension_types(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(payload)


def test_pickled_bytes_never_decode_to_the_pickled_object() -> None:
    class Evil:
        def __reduce__(self) -> tuple:  # what a pickle exploit looks like
            return (os.system, ("echo pwned",))

    payload = pickle.dumps(Evil())
    try:
        value = decode(payload)
    except ProtocolError:
        return
    assert not isinstance(value, Evil) and not callable(value)


def test_the_codec_refuses_to_encode_non_messages() -> None:
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode({"x": Path("/etc/passwd")})
    assert decode(encode(Heartbeat("worker:0", 1.0))) == Heartbeat("worker:0", 1.0)


@pytest.fixture(scope="module")
def guarded(pipeline_factory):
    pipeline = pipeline_factory()
    add_engine(pipeline, "engine-sec")
    add_gateway(pipeline, "gw-sec", "--api-key", API_KEY)
    add_gateway(pipeline, "gw-sec-metrics", "--api-key", API_KEY, "--metrics-require-key")
    wait_until_serving(pipeline)
    return pipeline


ENDPOINTS = [
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/openapi.json"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/no/such/path"),
]
BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}


def call(pipeline, gateway: int, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.request(method, f"{pipeline.base_url(gateway)}{path}", headers=headers,
                         json=BODIES.get(path), timeout=30)  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_the_api_key_is_required_everywhere_but_health_and_metrics(guarded, method, path):
    open_paths = {"/health", "/metrics"}
    for key in (None, "wrong-key", API_KEY[:-1], f"{API_KEY}x"):
        answer = call(guarded, 0, method, path, key)
        if path in open_paths:
            assert answer.status_code == 200, (key, answer.text[:200])
        else:
            assert answer.status_code == 401, (key, answer.status_code)
            assert answer.json()["error"]["message"]
    answer = call(guarded, 0, method, path, API_KEY)
    assert answer.status_code == (404 if path == "/no/such/path" else 200), answer.text[:300]


def test_metrics_require_the_key_when_told(guarded):
    assert call(guarded, 1, "GET", "/metrics", None).status_code == 401
    assert call(guarded, 1, "GET", "/metrics", API_KEY).status_code == 200
    assert call(guarded, 1, "GET", "/health", None).status_code == 200


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by `pid`."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.append((_address(address, width), int(port, 16)))
    return found


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    if width == 8:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # little-endian 32-bit words
    return bytes(b for w in words for b in w).hex()


LOOPBACK = {"127.0.0.1", "00000000000000000000000000000001", "0000000000000000ffff00007f000001"}


def test_every_service_listens_on_loopback_only_on_its_configured_ports(guarded):
    engine = guarded.engines[0]
    expected_ports = {
        "scheduler": {engine.plan_port, engine.result_port},
        "gateway": set(guarded.gateway_ports),
    }
    seen_ports: dict[str, set[int]] = {"scheduler": set(), "gateway": set()}
    for process in guarded.processes():
        sockets = listening_sockets(process.pid)
        for address, port in sockets:
            assert address in LOOPBACK, f"{process.name} listens on {address}:{port}"
        kind = "gateway" if process.name.startswith("gw-") else process.name.split("-")[0]
        if kind in seen_ports:
            seen_ports[kind] |= {port for _, port in sockets}
    assert seen_ports["scheduler"] == expected_ports["scheduler"]
    assert seen_ports["gateway"] == expected_ports["gateway"]


def test_redis_and_zeromq_endpoints_default_to_loopback_and_are_configurable(monkeypatch):
    from pagedserve.services.gateway.__main__ import parse_args as gateway_args
    from pagedserve.services.gpu_worker.__main__ import build_parser as worker_parser
    from pagedserve.services.scheduler.__main__ import build_parser as scheduler_parser

    scheduler = scheduler_parser().parse_args([])
    worker = worker_parser().parse_args([])
    gateway = gateway_args([])
    assert scheduler.host == worker.scheduler_host == gateway.host == "127.0.0.1"
    assert "127.0.0.1" in scheduler.redis_url and "127.0.0.1" in gateway.redis_url

    monkeypatch.setenv("PAGEDSERVE_REDIS_URL", "redis://10.0.0.5:6380/2")
    monkeypatch.setenv("PAGEDSERVE_HOST", "10.0.0.7")
    monkeypatch.setenv("PAGEDSERVE_PLAN_PORT", "7001")
    monkeypatch.setenv("PAGEDSERVE_RESULT_PORT", "7002")
    monkeypatch.setenv("PAGEDSERVE_SCHEDULER_HOST", "10.0.0.7")
    scheduler = scheduler_parser().parse_args([])
    worker = worker_parser().parse_args([])
    gateway = gateway_args([])
    assert scheduler.redis_url == gateway.redis_url == "redis://10.0.0.5:6380/2"
    assert (scheduler.host, scheduler.plan_port, scheduler.result_port) == ("10.0.0.7", 7001, 7002)
    assert (worker.scheduler_host, worker.plan_port, worker.result_port) == ("10.0.0.7", 7001, 7002)
    assert gateway.host == "10.0.0.7"
    flagged = scheduler_parser().parse_args(["--redis-url", "redis://r:1/0", "--plan-port", "9"])
    assert (flagged.redis_url, flagged.plan_port) == ("redis://r:1/0", 9)  # a flag wins
