"""Give memory back to the system after a big request body.

A multi-megabyte body passes through several buffers (chunks, the joined bytes, the decoded
text, the parsed prompt). CPython frees them, but glibc keeps freed heap memory for reuse and,
after the first large free, raises its mmap threshold so that later big buffers come from that
heap too: the process stays gigabytes large after a burst of big prompts. `malloc_trim(0)`
hands the free pages back; it costs a few milliseconds, so only after bodies of
`RELEASE_AFTER_BYTES` or more, and off the event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

RELEASE_AFTER_BYTES = 1024 * 1024


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc.malloc_trim if libc is not None else None  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_malloc_trim = _load_malloc_trim()


def release_free_memory() -> bool:
    """Return the allocator's free pages to the system; False where that is not possible."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


class ReleaseMemoryMiddleware:
    """Pure-ASGI: counts each request's body bytes; after a big one, trims the heap."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        num_body_bytes = 0

        async def counting_receive() -> Message:
            nonlocal num_body_bytes
            message = await receive()
            num_body_bytes += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            if num_body_bytes >= RELEASE_AFTER_BYTES:
                await asyncio.to_thread(release_free_memory)
