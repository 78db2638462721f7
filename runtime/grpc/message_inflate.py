"""Compressed gRPC messages inflated a piece at a time in a worker thread, never past the message limit, with the
bytes every call is inflating at once bounded (the one port's gRPC, ``runtime/grpc/asgi.py``; the native edge does
the same in ``native_inflate.h``).

Inflating a message whole and checking its size afterwards let a 1 MB gzip message take 2 GB and block the event
loop for 9 s; here no step inflates more than a few MiB, none on the loop, and the call is refused as soon as its
message passes the limit.
"""

from __future__ import annotations

import asyncio
import zlib

from runtime.grpc.byte_gate import ByteGate
from runtime.grpc.call_context import CallEnded
from runtime.grpc.status_codes import StatusCode

_WBITS = {"gzip": 31, "deflate": 15}  # gRPC's deflate is zlib's format
FIRST_STEP_BYTES = 1 << 20
STEP_BYTES = 16 << 20


def too_large(limit: int) -> CallEnded:
    return CallEnded(StatusCode.RESOURCE_EXHAUSTED,
                     f"Received message larger than max (more than {limit} bytes once decompressed vs. {limit})")


async def inflate(payload: bytes, encoding: str, limit: int, gate: ByteGate) -> bytes:
    """``payload`` inflated as ``encoding`` says, at most ``limit`` bytes; CallEnded where it cannot be."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise CallEnded(StatusCode.UNIMPLEMENTED, f"Compression algorithm '{encoding}' is not supported")
    inflater = zlib.decompressobj(wbits)
    pieces: list[bytes] = []
    total = held = 0
    rest = payload
    try:
        while True:
            step = min(FIRST_STEP_BYTES if not pieces else STEP_BYTES, limit + 1 - total)
            await gate.acquire(step)
            held += step
            try:
                piece = await asyncio.to_thread(inflater.decompress, rest, step)
            except zlib.error:
                raise CallEnded(StatusCode.INTERNAL, "a message could not be decompressed") from None
            pieces.append(piece)
            total += len(piece)
            rest = inflater.unconsumed_tail
            if total > limit:
                raise too_large(limit)
            if inflater.eof:
                return b"".join(pieces)
            if not rest and len(piece) < step:  # the input is used up before the stream's end
                raise CallEnded(StatusCode.INTERNAL, "a message could not be decompressed")
    finally:
        gate.release(held)
