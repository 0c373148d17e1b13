"""Status records kept in Redis hashes, readable with plain `redis-cli HGETALL`.

`EngineStatus` lives at `RedisKeys.engine(engine_id)` (refreshed every heartbeat, with a TTL);
`RequestStatus` at `RedisKeys.request(request_id)` (kept `REQUEST_STATUS_TTL_S` while it is open,
`--finished-request-ttl` seconds once it finished).
Fields are plain strings and numbers, not msgpack, so that people can read them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

ENGINE_STATUS_TTL_S = 15  # an engine whose status is older than this is taken for dead
STATUS_INTERVAL_S = 1.0  # a scheduler writes its whole record (counters included) this often
GATEWAY_HEARTBEAT_TTL_S = 10  # a gateway whose heartbeat key expired is taken for dead
REQUEST_STATUS_TTL_S = 24 * 3600  # an open request's record: it may wait long in a queue
# a finished one's, by default (`--finished-request-ttl`): ~530 bytes each in Redis, so a day's
# worth at 100 requests a second would be 4.6 GB
FINISHED_REQUEST_STATUS_TTL_S = 600
FINAL_STATES = frozenset({"finished", "aborted", "failed"})


@dataclass(frozen=True)
class EngineStatus:
    engine_id: str
    time: float  # unix seconds of this record
    workers_alive: bool  # every worker rank answered heartbeats recently
    num_workers: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    kv_usage: float = 0.0  # fraction of blocks in use
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (total)
    prefix_cache_hits: int = 0  # of which found (total)
    num_preemptions: int = 0  # total
    num_finished: int = 0  # total
    num_steps: int = 0  # total
    spec_num_drafts: int = 0  # total: sequence-steps with drafts checked
    spec_num_draft_tokens: int = 0  # total drafts checked
    spec_num_accepted_tokens: int = 0  # total drafts accepted
    model: str = ""
    pid: int = 0
    host: str = ""  # the scheduler's host name (its pod's, on Kubernetes)
    integrity_ok: bool = True  # the last idle check_integrity() passed (False: see its log)
    integrity_checked_at: float = 0.0  # unix seconds of that check; 0.0: none yet
    iteration_tokens: str = ""  # shared/iteration_histogram.py's encoding; "": none yet
    block_size: int = 0  # tokens per KV block (vllm:cache_config_info)
    # seconds, totals since start (services/scheduler/step_clock.py)
    scheduling_s: float = 0.0  # the scheduler's own work between steps: the worker waits
    step_in_flight_s: float = 0.0  # plan published -> result received
    worker_execute_s: float = 0.0  # rank 0's model execution inside that
    steps_planned_ahead: int = 0  # before the last step's result (async scheduling)
    num_speculative_tokens: int = 0  # draft tokens per sequence and step; 0: no speculation
    spec_accepted_per_pos: str = ""  # drafts accepted at each draft position, comma-separated
    # --kv-cache-metrics: sampled blocks' residency (status_histogram.py encodings); "": off
    kv_block_lifetime: str = ""
    kv_block_idle_before_evict: str = ""
    kv_block_reuse_gap: str = ""


@dataclass(frozen=True)
class RequestStatus:
    request_id: str
    state: str  # queued | running | preempted | finished | aborted | failed
    gateway_id: str = ""
    engine_id: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    queued_at: float = 0.0
    scheduled_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    finish_reason: str = ""
    error: str = ""


def is_engine_live(status: EngineStatus, now: float) -> bool:
    """The engine's workers answer and its record is fresh (younger than its TTL)."""
    return status.workers_alive and now - status.time <= ENGINE_STATUS_TTL_S


def to_fields(record: Any) -> dict[str, str]:
    """A status record as Redis hash fields (strings; booleans as "1"/"0")."""
    fields = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        fields[f.name] = str(int(value)) if isinstance(value, bool) else str(value)
    return fields


def from_fields(cls: type[T], fields: dict[str | bytes, str | bytes]) -> T:
    """Inverse of `to_fields`; missing fields take their defaults, unknown ones are ignored,
    so that records written by an older or newer version still read."""
    text = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in text:
            continue
        raw = text[f.name]
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if kind == "bool":
            kwargs[f.name] = raw not in ("0", "", "False", "false")
        elif kind == "int":
            kwargs[f.name] = int(float(raw))
        elif kind == "float":
            kwargs[f.name] = float(raw)
        else:
            kwargs[f.name] = raw
    return cls(**kwargs)
