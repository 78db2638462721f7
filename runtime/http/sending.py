"""Sending large answers to clients that may not read them.

A response handed to granian in one message is held whole until the client has read it, however slowly: six
clients asking for 50 MB each and reading a byte a second held 300 MB for as long as they liked.  A response
larger than ``CHUNK_BYTES`` is therefore sent in chunks (granian applies back-pressure per chunk), and:

- each chunk must be taken within ``send_timeout`` seconds, else the connection is closed (the client is
  cut off) and the response released;
- the bytes of every response still being sent count against one budget of the serving process
  (``max_unsent_bytes``); when a new one does not fit, the senders stalled longest (a chunk waiting over
  ``STALLED_SECONDS``) are cut off first, and if that does not make room the new answer is 503;
- a client that closes its connection ends the sending at once (granian's send then returns at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from starlette.types import Send

from runtime.errors import Unavailable
from runtime.http.status import error_body

logger = logging.getLogger(__name__)

CHUNK_BYTES = 256 * 1024
STALLED_SECONDS = 1.0
DEFAULT_SEND_TIMEOUT = 30.0
DEFAULT_MAX_UNSENT_BYTES = 1 << 30


@dataclass(eq=False)
class _Sending:
    size: int
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    waiting_since: float = 0.0  # when its current chunk was handed over (0: none waits)


class UnsentBytes:
    """The bytes of responses being sent in this process, bounded by ``limit`` (event loop only)."""

    def __init__(self, limit: int = DEFAULT_MAX_UNSENT_BYTES, send_timeout: float = DEFAULT_SEND_TIMEOUT) -> None:
        self.limit = limit
        self.send_timeout = send_timeout
        self.in_use = 0
        self._sending: set[_Sending] = set()

    def admit(self, size: int) -> _Sending:
        """Room for a response of ``size`` bytes, cutting off stalled senders if needed; Unavailable if none."""
        if self.in_use + size > self.limit:
            now = time.monotonic()
            stalled = sorted((s for s in self._sending if s.waiting_since and now - s.waiting_since > STALLED_SECONDS
                              and not s.cut.is_set()), key=lambda s: s.waiting_since)
            freed = 0
            for sending in stalled:
                if self.in_use - freed + size <= self.limit:
                    break
                sending.cut.set()
                freed += sending.size
            if self.in_use - freed + size > self.limit:
                raise Unavailable(f"{self.in_use} bytes of answers are waiting for clients to read them (budget "
                                  f"{self.limit}): retry later")
        sending = _Sending(size)
        self._sending.add(sending)
        self.in_use += size
        return sending

    def release(self, sending: _Sending) -> None:
        if sending in self._sending:
            self._sending.discard(sending)
            self.in_use -= sending.size


async def send_answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                      budget: UnsentBytes) -> None:
    """Send an answer as ASGI messages (``headers`` lower-case, Content-Length added); a body over ``CHUNK_BYTES``
    in chunks within ``budget``'s send timeout and byte bound (see the module)."""
    headers = [(b"content-length", str(len(body)).encode()), *headers]
    if len(body) <= CHUNK_BYTES:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    try:
        sending = budget.admit(len(body))
    except Unavailable as exc:  # nothing sent yet: the answer is a 503 instead (small: sent whole)
        await send_answer(send, 503, [(b"content-type", b"application/json")], error_body(exc.message), budget)
        return
    cut = asyncio.ensure_future(sending.cut.wait())
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for start in range(0, len(body), CHUNK_BYTES):
            last = start + CHUNK_BYTES >= len(body)
            # bytes, not a memoryview: granian takes bytes as they are, other buffers element by element
            message = {"type": "http.response.body", "body": body[start:start + CHUNK_BYTES], "more_body": not last}
            if not await _send_chunk(send, message, sending, cut, budget.send_timeout):
                return  # returning before the last chunk makes granian close the connection
    finally:
        cut.cancel()
        budget.release(sending)


async def _send_chunk(send: Send, message: dict, sending: _Sending, cut: asyncio.Future, timeout: float) -> bool:
    """Send one chunk; False when the client took nothing for ``timeout`` seconds, or was cut off."""
    sending.waiting_since = time.monotonic()
    chunk = asyncio.ensure_future(send(message))
    done, _ = await asyncio.wait({chunk, cut}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    sending.waiting_since = 0.0
    if chunk in done:
        chunk.result()
        return True
    chunk.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await chunk
    why = "to make room for other answers" if cut in done else f"after {timeout:g}s"
    logger.warning("a client that stopped reading its %d-byte answer was cut off %s", sending.size, why)
    return False
