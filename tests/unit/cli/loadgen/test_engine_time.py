"""The engine-time shares of a load level from two `/metrics` readings, against a real HTTP
server on loopback that serves a Prometheus text the way the gateway does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pagedserve.services.cli.loadgen.engine_time import (
    MAX_SETTLE_READS,
    engine_time_shares,
    format_shares,
    read_engine_seconds,
    read_until_settled,
)
from pagedserve.services.cli.loadgen.sse_client import EndpointConfig

LABELS = '{model_name="m"}'


def read_settled(endpoint: EndpointConfig) -> dict[str, float] | None:
    return read_engine_seconds(endpoint, settle_s=0.0)


def exposition(
    execute: float, in_flight: float, scheduling: float, drafts: int = 0, accepted: int = 0,
    steps: int = 0, planned_ahead: int = 0,
) -> str:  # fmt: skip
    return (
        "# TYPE pagedserve:worker_execute_seconds counter\n"
        f"pagedserve:worker_execute_seconds_total{LABELS} {execute}\n"
        f"pagedserve:step_in_flight_seconds_total{LABELS} {in_flight}\n"
        f"pagedserve:scheduling_seconds_total{LABELS} {scheduling}\n"
        f"vllm:spec_decode_num_draft_tokens_total{LABELS} {drafts}\n"
        f"vllm:spec_decode_num_accepted_tokens_total{LABELS} {accepted}\n"
        f"vllm:num_requests_running{LABELS} 2.0\n"
        f"vllm:iteration_tokens_total_count{LABELS} {steps}\n"
        f"pagedserve:steps_planned_ahead_total{LABELS} {planned_ahead}\n"
    )


@contextmanager
def metrics_server(
    bodies: list[tuple[int, str]], seen: list[tuple[str, str | None]] | None = None
) -> Iterator[EndpointConfig]:
    """Serves `bodies` in order, one per GET, then the last one again; each GET's path and
    Authorization header go to `seen`. The endpoint carries an API key."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if seen is not None:
                seen.append((self.path, self.headers.get("Authorization")))
            status, body = bodies.pop(0) if len(bodies) > 1 else bodies[0]
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield EndpointConfig(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", api_key="k")
    finally:
        server.shutdown()
        server.server_close()


def test_shares_are_each_counters_growth_over_the_wall_time() -> None:
    readings = [(200, exposition(10.0, 11.0, 1.0, 30, 10))] * 2 + [
        (200, exposition(17.5, 19.0, 1.5, 130, 70))]  # fmt: skip
    seen: list[tuple[str, str | None]] = []
    with metrics_server(readings, seen) as endpoint:
        before, after = read_settled(endpoint), read_settled(endpoint)
    # two reads each (the second confirms the first); a gateway may require its key on /metrics
    assert seen == [("/metrics", "Bearer k")] * 4
    assert before == {"execute": 10.0, "in_flight": 11.0, "scheduling": 1.0,
                      "draft_tokens": 30, "accepted_tokens": 10, "steps": 0,
                      "planned_ahead": 0}  # fmt: skip
    shares = engine_time_shares(before, after, wall_s=10.0)
    assert shares == pytest.approx({"execute": 0.75, "in_flight": 0.8, "scheduling": 0.05,
                                    "draft_tokens": 100, "accepted_tokens": 60, "steps": 0,
                                    "planned_ahead": 0})  # fmt: skip
    text = format_shares(shares)
    assert "model busy 75%" in text and "drafts accepted 60 of 100 (60%)" in text
    assert "drafts" not in format_shares({**shares, "draft_tokens": 0, "accepted_tokens": 0})
    assert "planned ahead" not in text


def test_a_reading_waits_until_two_reads_agree() -> None:
    """The scheduler writes its counters every STATUS_INTERVAL_S: read at once after a level,
    they may not hold its last steps yet, which the next level would then count as its own."""
    readings = [(200, exposition(6.0, 6.5, 0.3)), (200, exposition(6.4, 6.9, 0.3)),
                (200, exposition(6.5, 7.0, 0.4)), (200, exposition(6.5, 7.0, 0.4)),
                (200, exposition(9.0, 9.5, 0.5))]  # fmt: skip
    with metrics_server(readings) as endpoint:
        reading = read_settled(endpoint)
    assert (reading["execute"], reading["in_flight"], reading["scheduling"]) == (6.5, 7.0, 0.4)


def test_a_reading_that_never_settles_is_the_last_one_read() -> None:
    reads = iter(range(20))
    assert read_until_settled(lambda: next(reads), interval_s=0) == MAX_SETTLE_READS
    assert read_until_settled(lambda: None, interval_s=0) is None


def test_with_async_scheduling_the_share_of_steps_planned_ahead_is_shown() -> None:
    readings = [(200, exposition(1.0, 1.0, 0.1, steps=100, planned_ahead=90))] * 2 + [
        (200, exposition(9.0, 9.5, 0.2, steps=300, planned_ahead=280))]  # fmt: skip
    with metrics_server(readings) as endpoint:
        before, after = read_settled(endpoint), read_settled(endpoint)
    text = format_shares(engine_time_shares(before, after, wall_s=10.0))
    assert "model busy 80%" in text and "95% of steps planned ahead" in text


@pytest.mark.parametrize(
    "status, body",
    [(404, "not found"), (200, "vllm:num_requests_running 1.0\n")],
    ids=["no-metrics-endpoint", "no-step-counters"],
)
def test_a_server_without_the_counters_gives_none(status: int, body: str) -> None:
    with metrics_server([(status, body)]) as endpoint:
        assert read_settled(endpoint) is None
    assert engine_time_shares(None, {"execute": 1.0}, 1.0) is None
    assert format_shares(None) == ""


def test_an_unreachable_server_gives_none() -> None:
    with metrics_server([(200, "")]) as endpoint:
        pass  # closed: nothing listens on its port any more
    assert read_settled(endpoint) is None


def test_an_engine_that_does_not_speculate_reads_zero_drafts() -> None:
    """The speculation counters show only while an engine speculates (as vLLM's)."""
    body = "".join(line + "\n" for line in exposition(4.0, 5.0, 0.5).splitlines()
                   if not line.startswith("vllm:spec_decode"))  # fmt: skip
    with metrics_server([(200, body)]) as endpoint:
        reading = read_settled(endpoint)
    assert reading == {"execute": 4.0, "in_flight": 5.0, "scheduling": 0.5,
                       "draft_tokens": 0.0, "accepted_tokens": 0.0, "steps": 0.0,
                       "planned_ahead": 0.0}  # fmt: skip
