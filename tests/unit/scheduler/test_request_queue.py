from __future__ import annotations

import pytest

from pagedserve.services.scheduler.errors import QueueFullError
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    make_request_queue,
)
from pagedserve.shared.protocol import GenerateRequest, SamplingParams


def req(rid: str, index: int, priority: int = 0) -> Request:
    generate = GenerateRequest(rid, [1], SamplingParams(), priority=priority)
    return Request.from_generate(generate, arrival_index=index, now=0.0)


def ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_order_push_front_and_remove() -> None:
    queue = FCFSRequestQueue(max_waiting=10)
    a, b, c = req("a", 0), req("b", 1), req("c", 2)
    for r in (a, b, c):
        queue.add_request(r)
    queue.remove(b)
    assert ids(queue) == ["a", "c"] and b not in queue and a in queue
    assert queue.pop() is a
    queue.push_front(a)
    assert queue.peek() is a and ids(queue) == ["a", "c"]


def test_priority_order_then_arrival_with_lazy_removal() -> None:
    queue = PriorityRequestQueue(max_waiting=10)
    rs = [req("low", 0, priority=5), req("hi1", 1, priority=0), req("hi2", 2, priority=0)]
    for r in rs:
        queue.add_request(r)
    assert ids(queue) == ["hi1", "hi2", "low"]
    queue.remove(rs[1])
    assert len(queue) == 2 and queue.pop().request_id == "hi2"
    queue.push_front(rs[2])  # preempted: back under its own key
    queue.add_request(req("hi3", 3, priority=0))
    assert [queue.pop().request_id for _ in range(3)] == ["hi2", "hi3", "low"]
    with pytest.raises(IndexError, match="empty"):
        queue.pop()


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_queue_full_is_retryable_and_states_the_bound(policy: str) -> None:
    queue = make_request_queue(policy, max_waiting=2)
    queue.add_request(req("a", 0))
    queue.add_request(req("b", 1))
    with pytest.raises(QueueFullError, match=r"full \(2 requests, max_waiting=2\)") as info:
        queue.add_request(req("c", 2))
    assert info.value.retryable
    popped = queue.pop()
    queue.add_request(req("c", 2))
    queue.push_front(popped)  # a preempted request is never refused
    assert len(queue) == 3


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy must be"):
        make_request_queue("lifo", 1)
