"""Waiting queues: FCFS and priority, both bounded, both able to take a preempted request back
at the front. Every operation is O(1) (FCFS) or O(log n) (priority)."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator

from pagedserve.services.scheduler.errors import QueueFullError
from pagedserve.services.scheduler.request import Request


class BaseRequestQueue(ABC):
    """Contract: `add_request` appends a new request (refused beyond `max_waiting`);
    `push_front` returns a preempted request ahead of the ones it would have overtaken anyway
    and is never refused (it was already admitted); `peek`/`pop` give the next to run;
    `remove` drops a request wherever it is."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting

    def add_request(self, request: Request) -> None:
        if len(self) >= self.max_waiting:
            raise QueueFullError(
                f"waiting queue is full ({len(self)} requests, max_waiting={self.max_waiting}); "
                "retry later"
            )
        self._push(request)

    @abstractmethod
    def _push(self, request: Request) -> None: ...

    @abstractmethod
    def push_front(self, request: Request) -> None: ...

    @abstractmethod
    def peek(self) -> Request: ...

    @abstractmethod
    def pop(self) -> Request: ...

    @abstractmethod
    def remove(self, request: Request) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]: ...

    def __contains__(self, request: object) -> bool:
        return any(r is request for r in self)


class FCFSRequestQueue(BaseRequestQueue):
    """Arrival order. An OrderedDict is a hash map over a doubly linked list, so removing an
    aborted request from the middle is O(1)."""

    def __init__(self, max_waiting: int) -> None:
        super().__init__(max_waiting)
        self._requests: OrderedDict[str, Request] = OrderedDict()

    def _push(self, request: Request) -> None:
        self._requests[request.request_id] = request

    def push_front(self, request: Request) -> None:
        self._requests[request.request_id] = request
        self._requests.move_to_end(request.request_id, last=False)

    def peek(self) -> Request:
        if not self._requests:
            raise IndexError("waiting queue is empty")
        return next(iter(self._requests.values()))

    def pop(self) -> Request:
        if not self._requests:
            raise IndexError("waiting queue is empty")
        return self._requests.popitem(last=False)[1]

    def remove(self, request: Request) -> None:
        del self._requests[request.request_id]

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests.values()))

    def __contains__(self, request: object) -> bool:
        return isinstance(request, Request) and self._requests.get(request.request_id) is request


class PriorityRequestQueue(BaseRequestQueue):
    """Lower `priority` first, then earlier arrival. A heap with lazy deletion: `remove` marks
    the entry dead and `peek`/`pop` skip dead entries. A preempted request goes back under its
    original key, which puts it ahead of everything that arrived after it at its priority."""

    def __init__(self, max_waiting: int) -> None:
        super().__init__(max_waiting)
        self._heap: list[list] = []  # [priority, arrival_index, request or None when removed]
        self._entries: dict[str, list] = {}

    def _push(self, request: Request) -> None:
        entry = [request.priority, request.arrival_index, request]
        self._entries[request.request_id] = entry
        heapq.heappush(self._heap, entry)

    def push_front(self, request: Request) -> None:
        self._push(request)

    def peek(self) -> Request:
        self._drop_dead()
        if not self._heap:
            raise IndexError("waiting queue is empty")
        return self._heap[0][2]

    def pop(self) -> Request:
        request = self.peek()
        heapq.heappop(self._heap)
        del self._entries[request.request_id]
        return request

    def remove(self, request: Request) -> None:
        entry = self._entries.pop(request.request_id)
        entry[2] = None

    def _drop_dead(self) -> None:
        while self._heap and self._heap[0][2] is None:
            heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        live = [e for e in self._heap if e[2] is not None]
        return iter([e[2] for e in sorted(live, key=lambda e: (e[0], e[1]))])

    def __contains__(self, request: object) -> bool:
        if not isinstance(request, Request):
            return False
        entry = self._entries.get(request.request_id)
        return entry is not None and entry[2] is request


def make_request_queue(policy: str, max_waiting: int) -> BaseRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue(max_waiting)
    if policy == "priority":
        return PriorityRequestQueue(max_waiting)
    raise ValueError(f"policy must be 'fcfs' or 'priority', got {policy!r}")
