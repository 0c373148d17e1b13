"""Identical-output check between two servers: the same greedy fixed-length requests to each,
streamed through the benchmark client, and their texts compared.

Greedy decoding of the same model in the same dtype is a function of the prompt, so two
correct servers agree; a mismatch names the request and where the texts part."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedserve.services.cli.loadgen.latency_stats import RequestRecord
from pagedserve.services.cli.loadgen.sse_client import (
    EndpointConfig,
    apply_event,
    chunk_text,
    open_stream,
    parse_sse_line,
)
from pagedserve.services.cli.loadgen.workload import BenchRequest


async def stream_text(endpoint: EndpointConfig, request: BenchRequest) -> str:
    """The whole text one streamed completion generates; raises StreamError on failure."""
    record = RequestRecord(request.prompt_len, request.output_len)
    parts: list[str] = []
    async with asyncio.timeout(600.0), open_stream(endpoint, request) as lines:
        async for line in lines:
            event = parse_sse_line(line)
            if isinstance(event, dict):
                parts.append(chunk_text(event))
            if apply_event(event, record, 0.0):
                break
    return "".join(parts)


async def _all_texts(endpoint: EndpointConfig, requests: Sequence[BenchRequest]) -> list[str]:
    return list(await asyncio.gather(*(stream_text(endpoint, r) for r in requests)))


def greedy_texts(endpoint: EndpointConfig, requests: Sequence[BenchRequest]) -> list[str]:
    """Every request's text, sent all at once (so that the server batches them)."""
    return asyncio.run(_all_texts(endpoint, requests))


@dataclass(frozen=True)
class Mismatch:
    index: int  # of the request in the checked list
    first_difference: int  # character offset where the texts part
    ours: str  # the texts from there on (80 characters)
    theirs: str


def first_difference(a: str, b: str) -> int:
    """The first offset where `a` and `b` differ (the shorter length when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_texts(ours: Sequence[str], theirs: Sequence[str]) -> list[Mismatch]:
    """The requests whose texts differ, in order."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} texts against {len(theirs)}")
    mismatches = []
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            at = first_difference(a, b)
            mismatches.append(Mismatch(i, at, a[at : at + 80], b[at : at + 80]))
    return mismatches


def check_summary(ours: Sequence[str], theirs: Sequence[str]) -> dict[str, Any]:
    """The check's JSON record: how many requests, how many identical, the mismatches."""
    mismatches = compare_texts(ours, theirs)
    return {
        "num_requests": len(ours),
        "num_identical": len(ours) - len(mismatches),
        "mismatches": [m.__dict__ for m in mismatches],
    }
