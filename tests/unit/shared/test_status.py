from __future__ import annotations

from pagedserve.shared.status import EngineStatus, RequestStatus, from_fields, to_fields


def test_engine_status_round_trips_through_redis_fields():
    status = EngineStatus("e1", 12.5, True, num_workers=2, num_running=3, kv_usage=0.25)
    fields = to_fields(status)
    assert fields["workers_alive"] == "1"
    assert fields["kv_usage"] == "0.25"
    raw = {k.encode(): v.encode() for k, v in fields.items()}  # as redis-py returns them
    assert from_fields(EngineStatus, raw) == status


def test_missing_fields_take_defaults_and_unknown_ones_are_ignored():
    status = from_fields(RequestStatus, {"request_id": "r", "state": "queued", "extra": "x"})
    assert status == RequestStatus("r", "queued")


def test_false_booleans_read_back_false():
    status = from_fields(EngineStatus, {"engine_id": "e", "time": "1", "workers_alive": "0"})
    assert status.workers_alive is False
