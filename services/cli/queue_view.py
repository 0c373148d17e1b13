"""Plain-text tables for `pagedserve queue`, from the dicts that `queue_reader` returns."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pagedserve.shared.status import RequestStatus

ENGINE_COLUMNS = ("engine", "host", "alive", "running", "waiting", "kv usage", "free blocks",
                  "cached blocks", "routed", "heartbeat")  # fmt: skip


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart; `(none)` under the headers when empty."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def render_queue(snapshot: dict[str, Any]) -> str:
    """The overview: stream depth, per-engine pending, in-flight requests, engines, gateways."""
    stream = snapshot["stream"]
    parts = [
        f"namespace {snapshot['namespace']}",
        "",
        "REQUEST STREAM",
        format_table(
            ["key", "length", "undelivered", "pending", "oldest undelivered", "oldest pending"],
            [
                [
                    stream["key"],
                    stream["length"],
                    "-" if stream["undelivered"] is None else stream["undelivered"],
                    stream["pending"],
                    format_age(stream["oldest_undelivered_age_s"]),
                    format_age(stream["oldest_pending_age_s"]),
                ]
            ],
        ),
        "",
        "PENDING PER ENGINE (group engines)",
        format_table(
            ["engine", "pending", "idle"],
            [[c["name"], c["pending"], format_age(c["idle_s"])] for c in snapshot["consumers"]],
        ),
        "",
        "IN FLIGHT (oldest first)",
        format_table(
            ["request", "engine", "age", "deliveries", "state"],
            [
                [
                    r["request_id"],
                    r["engine_id"],
                    format_age(r["age_s"]),
                    r["deliveries"],
                    r["state"] or "-",
                ]
                for r in snapshot["in_flight"]
            ],
        ),
        "",
        "ENGINES",
        format_table(ENGINE_COLUMNS, [_engine_row(e) for e in snapshot["engines"]]),
        "",
        "GATEWAYS",
        format_table(
            ["gateway", "alive", "ttl"],
            [
                [g["gateway_id"], "yes" if g["alive"] else "no", f"{g['ttl_s']} s"]
                for g in snapshot["gateways"]
            ],
        ),
    ]
    return "\n".join(parts)


def _engine_row(engine: dict[str, Any]) -> list[Any]:
    if engine.get("heartbeat_age_s") is None:
        return [engine["engine_id"], "-", "no (status expired)", "-", "-", "-", "-",
                engine["num_cached_blocks"], engine["num_routed"], "-"]  # fmt: skip
    alive = "yes" if engine["alive"] and engine["workers_alive"] else "no"
    if engine["alive"] and not engine["workers_alive"]:
        alive = "no (workers down)"
    return [
        engine["engine_id"],
        engine["host"] or "-",
        alive,
        engine["num_running"],
        engine["num_waiting"],
        f"{engine['kv_usage'] * 100:.1f}%",
        f"{engine['num_free_blocks']}/{engine['num_total_blocks']}",
        engine["num_cached_blocks"],
        engine["num_routed"],
        format_age(engine["heartbeat_age_s"]) + " ago",
    ]


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-3]


def render_request(status: RequestStatus) -> str:
    """One request's state and its timeline, each event with its offset from queueing."""
    lines = [
        f"request   {status.request_id}",
        f"state     {status.state}"
        + (f" ({status.finish_reason})" if status.finish_reason else ""),
        f"gateway   {status.gateway_id or '-'}",
        f"engine    {status.engine_id or '-'}",
        f"tokens    {status.num_prompt_tokens} prompt, {status.num_output_tokens} output",
    ]
    if status.error:
        lines.append(f"error     {status.error}")
    events = [
        ("queued", status.queued_at),
        ("scheduled", status.scheduled_at),
        ("first token", status.first_token_at),
        ("finished", status.finished_at),
    ]
    rows = []
    for name, at in events:
        if not at:
            rows.append([name, "-", "-"])
            continue
        offset = f"+{(at - status.queued_at) * 1000:.0f} ms" if status.queued_at else "-"
        rows.append([name, _clock(at) + " UTC", offset])
    return "\n".join([*lines, "", format_table(["event", "time", "since queued"], rows)])
