"""Reading request bodies within a size limit, inflating gzip/deflate without bombs."""

from __future__ import annotations

import zlib

from starlette.requests import Request

from runtime.errors import InvalidArgument, ResourceExhausted

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_WBITS_BY_ENCODING = {"gzip": 31, "deflate": 15}


def _too_large(limit: int) -> ResourceExhausted:
    return ResourceExhausted(f"request body is larger than the limit of {limit} bytes")


async def read_body(request: Request, limit: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The request body, refused before buffering when it would exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidArgument("Content-Length must be a non-negative integer")
        if int(declared) > limit:
            raise _too_large(limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    wbits = _WBITS_BY_ENCODING.get(encoding)
    if wbits is None:
        raise InvalidArgument(f"unsupported Content-Encoding '{encoding[:32]}'")
    inflater = zlib.decompressobj(wbits)
    try:
        inflated = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"cannot decompress the {encoding} request body: {exc}") from None
    if len(inflated) > limit or inflater.unconsumed_tail:
        raise _too_large(limit)
    return inflated


def compress(body: bytes, accept_encoding: str) -> tuple[bytes, str | None]:
    """Compress a response body if the client asked for gzip or deflate."""
    accepted = {part.split(";")[0].strip().lower() for part in accept_encoding.split(",")}
    for encoding in ("gzip", "deflate"):
        if encoding in accepted:
            deflater = zlib.compressobj(6, zlib.DEFLATED, _WBITS_BY_ENCODING[encoding])
            return deflater.compress(body) + deflater.flush(), encoding
    return body, None
