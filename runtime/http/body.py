"""Reading request bodies within a size limit, inflating gzip/deflate without bombs."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from runtime.deadline_wheel import deadline_wheel
from runtime.errors import Cancelled, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable, Unsupported
from runtime.http.limits import DEFAULT_JSON_BUDGET_BYTES, DEFAULT_MAX_BODY_BYTES

# A body without a Content-Length (chunked, or HTTP/2 frames) is held as the pieces the listener hands over: at
# most this many non-empty ones, as Triton 2.69 caps a chunked body's chunks (server #8770), so that a million
# one-byte chunks cannot cost a million objects.
MAX_BODY_CHUNKS = 1 << 16
TOO_MANY_CHUNKS = (f"Chunked request body exceeds maximum of {MAX_BODY_CHUNKS} non-empty chunks. Send fewer or "
                   "larger HTTP chunks.")
DEFAULT_BODY_TIMEOUT = 120.0


class BodyTimeout(DeadlineExceeded):
    """The client did not send its whole request body in time (HTTP 408)."""


_WBITS_BY_ENCODING = {"gzip": 31, "deflate": 15}
_UNBOUNDED = contextlib.nullcontext()  # no deadline of its own (reusable)


def _too_large(limit: int) -> ResourceExhausted:
    return ResourceExhausted(f"request body is larger than the limit of {limit} bytes. Use --http-max-input-size "
                             "to increase the limit.")  # Triton 2.59's advice


async def receive_asgi_body(
    receive: Receive, content_length: str | None, limit: int = DEFAULT_MAX_BODY_BYTES,
    timeout: float | None = DEFAULT_BODY_TIMEOUT, gather: Callable[[int], Any] | None = None,
) -> list[bytes] | list[memoryview]:
    """The request body's chunks as received from ``receive``, refused before buffering when its Content-Length
    (or what arrives) exceeds ``limit`` bytes, refused (BodyTimeout) when it has not fully arrived within
    ``timeout`` seconds (None: the caller bounds the wait, as the infer route's request watch does), and
    Cancelled if the client disconnects first.

    A body of a declared length is complete once that many bytes have come: the listener's closing message
    (granian sends an empty one after the data) is not waited for, which saves a hand-off per request.

    ``gather(size)``: for a body of a declared length, a writable buffer of ``size`` bytes to copy each chunk
    into as it comes (None: none now); the body is then one chunk, a view of that buffer, and no chunk outlives
    its copy (a large body was held twice: its chunks, then their join)."""
    expected = -1
    if content_length is not None:
        if not content_length.isdigit():
            raise InvalidArgument("Content-Length must be a non-negative integer")
        expected = int(content_length)
        if expected > limit:
            raise _too_large(limit)
    target = gather(expected) if gather is not None and expected > 0 else None
    if target is not None:
        return await _receive_into(receive, memoryview(target).cast("B")[:expected], timeout)
    chunks: list[bytes] = []
    total = 0
    pieces_left = MAX_BODY_CHUNKS if expected < 0 else -1  # a chunked body: at most that many pieces
    try:
        with deadline_wheel().timeout(timeout) if timeout is not None else _UNBOUNDED:
            while total != expected:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Cancelled("the client disconnected before sending its whole request")
                chunk = message.get("body", b"")
                if chunk:
                    total += len(chunk)
                    if total > limit:
                        raise _too_large(limit)
                    if pieces_left == 0:
                        raise InvalidArgument(TOO_MANY_CHUNKS)
                    pieces_left -= 1
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks
            return chunks
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {timeout:g}s") from None


async def _receive_into(receive: Receive, target: memoryview, timeout: float | None) -> list[memoryview]:
    """receive_asgi_body's body of a declared length, each chunk copied into ``target`` as it comes."""
    filled = 0
    try:
        with deadline_wheel().timeout(timeout) if timeout is not None else _UNBOUNDED:
            while filled != len(target):
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Cancelled("the client disconnected before sending its whole request")
                chunk = message.get("body", b"")
                if len(chunk) > len(target) - filled:
                    raise InvalidArgument("the request body is longer than its Content-Length")
                target[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {timeout:g}s") from None
    return [target[:filled]]


async def receive_body(
    request: Request, limit: int = DEFAULT_MAX_BODY_BYTES, timeout: float = DEFAULT_BODY_TIMEOUT
) -> list[bytes] | list[memoryview]:
    """A Starlette request's body chunks, as :func:`receive_asgi_body` takes them."""
    return await receive_asgi_body(request.receive, request.headers.get("content-length"), limit, timeout)


def assemble_body(chunks: list[bytes] | list[memoryview], content_encoding: str, limit: int = DEFAULT_MAX_BODY_BYTES,
                  into: Callable[[int], Any] | None = None) -> bytes | memoryview:
    """Join received chunks and inflate gzip/deflate, never past ``limit`` bytes (blocking for large bodies).
    ``into(size)``: a writable buffer to join an uncompressed body into (the core's shared tensor pool, where a
    Python worker reads the tensors in place), or None to join it into bytes.  Joined into ``into``, ``chunks`` is
    emptied as it goes, each chunk let go once copied.  (A large body of a declared length never comes here in
    chunks: receive_asgi_body's ``gather`` receives it in place.)"""
    encoding = content_encoding.strip().lower()
    identity = encoding in ("", "identity")
    if len(chunks) == 1:
        body: bytes | memoryview = chunks[0]
    else:
        target = into(sum(len(chunk) for chunk in chunks)) if into is not None and identity else None
        if target is None:
            body = b"".join(chunks)
        else:
            joined = memoryview(target).cast("B")
            position = 0
            for index, chunk in enumerate(chunks):
                joined[position : position + len(chunk)] = chunk  # type: ignore[call-overload]  # any buffer
                position += len(chunk)
                chunks[index] = b""  # type: ignore[call-overload]  # let each piece go once copied
            body = joined
    if identity:
        return body
    wbits = _WBITS_BY_ENCODING.get(encoding)
    if wbits is None:
        raise Unsupported("Unsupported compression type")
    inflater = zlib.decompressobj(wbits)
    try:
        inflated = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"cannot decompress the {encoding} request body: {exc}") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise _too_large(limit)
    return inflated


async def read_body(
    request: Request, limit: int = DEFAULT_MAX_BODY_BYTES, timeout: float = DEFAULT_BODY_TIMEOUT
) -> bytes:
    """A (small) request body, whole and inflated."""
    chunks = await receive_body(request, limit, timeout)
    body = assemble_body(chunks or [b""], request.headers.get("content-encoding", "identity"), limit)
    return body if isinstance(body, bytes) else bytes(body)  # received whole, not into a buffer: bytes already


def compress(body: bytes, accept_encoding: str) -> tuple[bytes, str | None]:
    """Compress a response body if the client asked for gzip or deflate."""
    if not accept_encoding:
        return body, None
    accepted = {part.split(";")[0].strip().lower() for part in accept_encoding.split(",")}
    for encoding in ("gzip", "deflate"):
        if encoding in accepted:
            # A window no larger than the body compresses it exactly as well, and zlib then neither allocates nor
            # clears the full 256 KiB state: a small response compresses in 8 us instead of 60.
            window = min(15, max(9, (len(body) - 1).bit_length()))
            wbits = _WBITS_BY_ENCODING[encoding] - 15 + window
            deflater = zlib.compressobj(6, zlib.DEFLATED, wbits, min(8, max(1, window - 7)))
            return deflater.compress(body) + deflater.flush(), encoding
    return body, None


class ByteBudget:
    """Bounds the bytes of large JSON bodies being read and decoded at once (decoding costs memory
    in proportion to the text): past the budget a request is refused at once, before it is buffered."""

    def __init__(self, limit: int = DEFAULT_JSON_BUDGET_BYTES) -> None:
        self.limit = limit
        self.in_use = 0

    def take(self, size: int) -> int:
        """Reserve ``size`` bytes (give them back with :meth:`give_back`); refused past the budget."""
        if size > self.limit:
            raise ResourceExhausted(
                f"the request's JSON ({size} bytes) is larger than the JSON decode budget ({self.limit} bytes): "
                "send tensors as binary data"
            )
        if self.in_use + size > self.limit:
            raise Unavailable(
                f"the server is decoding {self.in_use} bytes of other JSON requests (budget {self.limit}): "
                "retry, or send tensors as binary data"
            )
        self.in_use += size
        return size

    def give_back(self, size: int) -> None:
        self.in_use -= size
