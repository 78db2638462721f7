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
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.types import Send

from runtime.deadline_wheel import deadline_wheel
from runtime.errors import Unavailable
from runtime.http.limits import DEFAULT_MAX_UNSENT_BYTES, DEFAULT_SEND_TIMEOUT
from runtime.http.status import error_body

logger = logging.getLogger(__name__)

Part = bytes | memoryview  # a piece of an answer's body, read where it lies
CHUNK_BYTES = 256 * 1024
STALLED_SECONDS = 1.0


@dataclass(eq=False)
class _Sending:
    size: int
    task: asyncio.Task | None = None  # the task sending it
    cut: bool = False  # cut off to make room for other answers
    waiting_since: float = 0.0  # when its current chunk was handed over (0: none waits)

    def cut_off(self) -> None:
        """Stop this answer: its sender, waiting on a chunk, is cancelled and returns (see :func:`send_answer`)."""
        if not self.cut:
            self.cut = True
            if self.waiting_since and self.task is not None:
                self.task.cancel()


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
                              and not s.cut), key=lambda s: s.waiting_since)
            freed = 0
            for sending in stalled:
                if self.in_use - freed + size <= self.limit:
                    break
                sending.cut_off()
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


async def send_answer(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes | list[Part],
                      budget: UnsentBytes) -> None:
    """Send an answer as ASGI messages (``headers`` lower-case, Content-Length added); ``body`` whole, or as the
    parts it is joined from (an answer's JSON header and its tensors, read in place).  A body over ``CHUNK_BYTES``
    goes in chunks cut straight from the parts, within ``budget``'s send timeout and byte bound (see the module)."""
    parts: list[bytes | memoryview]
    if isinstance(body, bytes):
        parts, size = [body], len(body)
    else:
        parts, size = body, 0
        for part in parts:
            size += len(part)
    headers = [(b"content-length", str(size).encode()), *headers]
    if size <= CHUNK_BYTES:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body if isinstance(body, bytes) else b"".join(parts)})
        return
    try:
        sending = budget.admit(size)
    except Unavailable as exc:  # nothing sent yet: the answer is a 503 instead (small: sent whole)
        await send_answer(send, 503, [(b"content-type", b"application/json")], error_body(exc.message), budget)
        return
    sending.task = asyncio.current_task()
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        sent = 0
        for chunk in _chunks(parts):
            sent += len(chunk)
            # bytes, not a memoryview: granian takes bytes as they are, other buffers element by element
            message = {"type": "http.response.body", "body": chunk, "more_body": sent < size}
            if not await _send_chunk(send, message, sending, budget.send_timeout):
                return  # returning before the last chunk makes granian close the connection
    finally:
        sending.task = None
        budget.release(sending)


def _chunks(parts: list[Part]) -> Iterator[bytes]:
    """``CHUNK_BYTES`` at a time of the parts joined, each chunk copied once from the parts it spans."""
    pending: list[Part] = []
    pending_size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            taken = view[:CHUNK_BYTES - pending_size]
            view = view[len(taken):]
            pending.append(taken)
            pending_size += len(taken)
            if pending_size == CHUNK_BYTES:
                yield b"".join(pending)
                pending, pending_size = [], 0
    if pending:
        yield b"".join(pending)


async def _send_chunk(send: Send, message: dict, sending: _Sending, timeout: float) -> bool:
    """Send one chunk; False when the client took nothing for ``timeout`` seconds, or was cut off.  The wait is
    bounded by the loop's deadline wheel and a cut-off cancels this task: no task, future or timer of its own."""
    if sending.cut:
        why = "to make room for other answers"
    else:
        sending.waiting_since = time.monotonic()
        try:
            with deadline_wheel().timeout(timeout):
                await send(message)
            return True
        except TimeoutError:
            why = f"after {timeout:g}s"
        except asyncio.CancelledError:
            if not sending.cut:  # the server's own cancellation
                raise
            assert sending.task is not None
            sending.task.uncancel()
            why = "to make room for other answers"
        finally:
            sending.waiting_since = 0.0
    logger.warning("a client that stopped reading its %d-byte answer was cut off %s", sending.size, why)
    return False
