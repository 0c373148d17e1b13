"""pagedserve on four kinds of host (tests/multihost/cluster.py), under streaming load through
the `openai` client, while hosts fail: the gateway host's link goes down and up, the Redis
primary's host dies (the sentinels promote the replica), an engine host dies (the other engine
claims its requests once its heartbeat expires). Every stream must end with the text of a
fault-free run: nothing lost, nothing repeated. The tests run in file order on one cluster;
the engine host's loss is last, since it leaves one engine.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.integration.pipeline.served_model import build_served_model
from tests.multihost.cluster import MultiHost
from tests.multihost.figures import FIGURES
from tests.multihost.network import can_build_hosts

pytestmark = pytest.mark.multihost

PROMPTS = [
    "The quick brown fox",
    "Paged attention stores the key",
    "Continuous batching adds and removes",
    "Hello, world! How are",
    "Once upon a time there was",
    "The lazy dog",
    "fixed size blocks",
    "a little server that answered",
]
MAX_TOKENS = 48
CONCURRENCY = 8
PIECES_AFTER_FAULT = 200  # the load must go on this far after each fault
# How long the replica's link is congested before the primary dies: below the sentinels'
# down-after (1 s), so that they still count the replica as up and promote it.
LAG_S = 0.8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    reason = can_build_hosts()
    if reason:
        pytest.fail(f"make test-multihost {reason}")
    work_dir = tmp_path_factory.mktemp("multihost")
    model_dir = build_served_model(work_dir / "model")
    hosts = MultiHost(work_dir, model_dir)
    try:
        yield hosts.start()
    finally:
        hosts.stop()


@pytest.fixture(scope="module")
def reference(cluster: MultiHost) -> dict[int, str]:
    """Each prompt's greedy text in a fault-free run."""
    run = cluster.load(PROMPTS, MAX_TOKENS, len(PROMPTS), num_requests=len(PROMPTS))
    results = run.results()
    assert sorted(r["prompt_index"] for r in results) == list(range(len(PROMPTS)))
    assert all(r["error"] is None and r["finish_reason"] == "length" for r in results), results
    return {r["prompt_index"]: r["text"] for r in results}


def check_every_stream(results: list[dict], reference: dict[int, str]) -> None:
    assert results, "the load sent no request"
    failed = [r for r in results if r["error"] is not None]
    assert not failed, f"{len(failed)} of {len(results)} streams failed: {failed[:3]}"
    wrong = [r for r in results if r["text"] != reference[r["prompt_index"]]]
    assert not wrong, f"{len(wrong)} texts differ from the fault-free run: {wrong[:3]}"
    assert all(r["finish_reason"] == "length" for r in results)


def wait_for_pieces(cluster: MultiHost, run, num_more: int, timeout_s: float = 180) -> None:
    start = run.num_pieces
    cluster.wait_until(f"{num_more} more pieces streamed",
                       lambda: run.num_pieces >= start + num_more, timeout_s)  # fmt: skip


def spanning(results: list[dict], start: float, end: float) -> list[dict]:
    """The requests open at some time in [start, end]."""
    return [r for r in results if r["started_at"] <= end and r["finished_at"] >= start]


def summary(results: list[dict]) -> dict[str, object]:
    """What the clients saw: how many streams stalled, the longest stall, and the refusals
    (503, no connection) that a client retried before its first piece."""
    return {
        "requests": len(results),
        "streams paused > 2 s": sum(r["max_gap_s"] > 2 for r in results),
        "longest pause s": round(max(r["max_gap_s"] for r in results), 2),
        "refused then retried": sum(len(r["refusals"]) for r in results),
    }


def test_queue_shows_both_engines_and_their_hosts(cluster: MultiHost, reference) -> None:
    engines = cluster.engines()
    assert engines["engine0"]["host"] == "engine-a" and engines["engine0"]["alive"]
    assert engines["engine1"]["host"] == "engine-b" and engines["engine1"]["alive"]
    text = cluster.queue().stdout
    assert re.search(r"^engine0\s+engine-a\s+yes", text, re.M), text
    assert re.search(r"^engine1\s+engine-b\s+yes", text, re.M), text


def test_gateway_host_link_down_and_up(cluster: MultiHost, reference) -> None:
    run = cluster.load(PROMPTS, MAX_TOKENS, CONCURRENCY)
    wait_for_pieces(cluster, run, 50)
    gateways = cluster.host("gateways")
    down_at = time.time()
    gateways.set_link(False)
    time.sleep(3.0)
    gateways.set_link(True)
    up_at = time.time()
    wait_for_pieces(cluster, run, PIECES_AFTER_FAULT)
    run.stop()
    results = run.results()
    check_every_stream(results, reference)
    FIGURES["gateway host link down 3 s"] = summary(results)
    assert spanning(results, down_at, up_at), "no stream was open while the link was down"


def test_redis_primary_host_dies(cluster: MultiHost, reference) -> None:
    replica = cluster.host("redis-replica").address
    run = cluster.load(PROMPTS, MAX_TOKENS, CONCURRENCY)
    wait_for_pieces(cluster, run, 50)
    primary = cluster.host("redis")
    # The replica's link congested for a moment before the primary dies: replication lags
    # behind what the primary has acknowledged, and that tail is lost with it.
    # New requests arrive in that moment, while both schedulers are stalled (stopped): queued
    # on the primary only, read by no engine, they are lost with it.
    burst = cluster.load(PROMPTS, MAX_TOKENS, len(PROMPTS), len(PROMPTS), wait_for_go=True)
    cluster.wait_until("the burst's client ready", burst.ready_file.exists, 60)
    replica_host = cluster.host("redis-replica")
    cluster.pause_schedulers(True)
    replica_host.slow_inbound("8kbit")
    burst.go()
    time.sleep(LAG_S)
    died_at = time.time()
    primary.set_link(False)  # first the network, then the power: nothing more leaves it
    primary_offset = int(cluster.info("redis", on="redis")["master_repl_offset"])
    primary.kill_everything()
    replica_host.slow_inbound(None)
    cluster.pause_schedulers(False)
    cluster.wait_until(
        "the sentinels promoting the replica", lambda: cluster.primary_address() == replica, 60
    )
    promoted_at = time.time()
    wait_for_pieces(cluster, run, PIECES_AFTER_FAULT)
    run.stop()
    results = run.results() + burst.results()
    check_every_stream(results, reference)
    new_primary = cluster.info("redis-replica")
    assert new_primary["role"] == "master"
    # The replica took over at its own offset: bytes past it, which the dead primary had
    # accepted, are what asynchronous replication lost.
    replicated = int(new_primary["second_repl_offset"]) - 1
    requeued = requeued_counts(cluster)
    FIGURES["Redis primary host dies"] = {
        "replica promoted after s": round(promoted_at - died_at, 1),
        "replication bytes lost": max(0, primary_offset - replicated),
        "re-queued by gateways": requeued,
        **summary(results),
    }
    assert requeued is not None, "no gateway checked for lost requests after the failover"
    assert requeued >= 1, "no request of the burst was lost: the loss window was not hit"


def requeued_counts(cluster: MultiHost) -> int | None:
    """Requests the gateways queued again after seeing a new Redis (None: none looked)."""
    found = None
    for name in ("gateway-0", "gateway-1"):
        log = cluster.processes[name].log()
        for lost in re.findall(r"(\d+) of \d+ open request\(s\) lost", log):
            found = (found or 0) + int(lost)
    return found


def freeze_holding_requests(cluster: MultiHost) -> bool:
    cluster.pause_schedulers(True, ("engine0",))
    if cluster.pending().get("engine0", 0) > 0:
        return True
    cluster.pause_schedulers(False, ("engine0",))
    time.sleep(0.3)
    return False


def test_engine_host_dies(cluster: MultiHost, reference) -> None:
    run = cluster.load(PROMPTS, MAX_TOKENS, 12)
    wait_for_pieces(cluster, run, 50)
    # The host freezes, then dies: frozen, its scheduler's requests stay pending, so it is
    # killed holding some (a request lasts a second or two; an engine may hold none at times).
    frozen = lambda: freeze_holding_requests(cluster)
    cluster.wait_until("engine0 frozen with requests pending", frozen, 120)
    engine_a = cluster.host("engine-a")
    died_at = time.time()
    engine_a.kill_everything()
    engine_a.set_link(False)
    survivor = cluster.processes["scheduler-engine1"]
    claim = re.compile(r"claimed (\d+) un-ACKed request\(s\) of dead engine engine0")
    cluster.wait_until("engine1 claiming engine0's requests",
                       lambda: claim.search(survivor.log()) is not None, 120)  # fmt: skip
    claimed_at = time.time()
    wait_for_pieces(cluster, run, PIECES_AFTER_FAULT)
    run.stop()
    results = run.results()
    check_every_stream(results, reference)
    num_claimed = sum(int(n) for n in claim.findall(survivor.log()))
    assert num_claimed >= 1
    FIGURES["engine host dies"] = {
        "claimed after s": round(claimed_at - died_at, 1),
        "requests claimed": num_claimed,
        **summary(results),
    }
    engines = cluster.engines()
    assert not engines["engine0"]["alive"] and engines["engine1"]["alive"]
