"""Why the scheduler refuses a request. The gateway maps each to an HTTP status."""

from __future__ import annotations


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound. Retryable: the same request may succeed later."""

    retryable = True


class RequestRejectedError(ValueError):
    """The request can never run on this engine (too long, invalid, duplicate id)."""

    retryable = False
