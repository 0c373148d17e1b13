"""The transport round-trip benchmark, really run: a spawned echo worker answers every plan
through the real sockets, for both transports."""

from __future__ import annotations

import pytest

from benchmarks.transport_rtt import answer, decode_plan, main, measure


def test_the_worker_answers_each_sequence_of_the_plan() -> None:
    plan = decode_plan(3, step_id=7)
    result = answer(plan)
    assert result.step_id == 7 and result.seq_ids == [s.seq_id for s in plan.cached_seqs]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_round_trips_through_a_real_worker(transport: str) -> None:
    row = measure(transport, num_seqs=64, num_trips=20, pause_s=0.001)
    assert row["transport"] == transport and row["num_seqs"] == 64
    # the messages cost at least what encoding and decoding them costs in one process
    assert 0 < row["codec_ms"] < row["round_trip_p50_ms"] <= row["round_trip_p90_ms"]


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="ipc or tcp"):
        main(["--transports", "udp", "--num-seqs", "1", "--num-trips", "1"])
