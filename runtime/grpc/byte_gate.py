"""Bytes held by ModelStreamInfer streams, bounded per stream and across the serving process.

Counting requests in flight was not enough: a stream offering 300 x 1 MiB requests and reading nothing grew the
server by 134 MiB before its 64 slots filled.  A stream now also holds, in bytes, each request from when it is read
until its first response exists, and each response from when it exists until it is handed to gRPC; past either
bound it waits (the stream is then not read: HTTP/2 flow control holds its client back).
"""

from __future__ import annotations

import asyncio
from collections import deque

DEFAULT_STREAM_MAX_BYTES = 16 << 20
DEFAULT_STREAMS_MAX_BYTES = 1 << 30


class ByteGate:
    """Up to ``limit`` bytes held at once, taken in arrival order; one holder larger than ``limit`` gets in when
    nothing else is held (so no single message waits forever).  Event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    def _fits(self, size: int) -> bool:
        return self.used + size <= self.limit or self.used == 0

    async def acquire(self, size: int) -> None:
        if not self._waiting and self._fits(size):
            self.used += size
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((size, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(size)  # granted as it was cancelled
            raise

    def release(self, size: int) -> None:
        self.used -= size
        while self._waiting:
            size, granted = self._waiting[0]
            if granted.done():  # cancelled while waiting
                self._waiting.popleft()
                continue
            if not self._fits(size):
                break
            self._waiting.popleft()
            self.used += size
            granted.set_result(None)


class StreamBytes:
    """One stream's bytes, counted against its own gate and the process's."""

    def __init__(self, stream_limit: int, shared: ByteGate) -> None:
        self.own = ByteGate(stream_limit)
        self.shared = shared

    async def acquire(self, size: int) -> None:
        await self.own.acquire(size)
        try:
            await self.shared.acquire(size)
        except asyncio.CancelledError:
            self.own.release(size)
            raise

    def release(self, size: int) -> None:
        self.shared.release(size)
        self.own.release(size)
