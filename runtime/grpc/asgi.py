"""GRPCInferenceService over ASGI, for one port that serves REST and gRPC (``runtime/listen/single_port.py``).

A gRPC call is an HTTP/2 request with ``content-type: application/grpc``: length-prefixed messages in its body,
the status in its trailers (the ASGI ``http.response.trailers`` extension). This adapter runs the same servicer as
the grpc.aio server, with what grpcio does around it done here: the token and the restricted API groups checked
from the call's metadata, ``grpc-timeout`` as a deadline, ``grpc-encoding`` (gzip, deflate) on requests, message
size limits, undecodable messages as INVALID_ARGUMENT, and the status and its message in the trailers.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

from runtime.auth import TokenAuth
from runtime.grpc.byte_gate import DEFAULT_STREAMS_MAX_BYTES, ByteGate
from runtime.grpc.call_context import CallEnded, ServicerCallContext
from runtime.grpc.call_refusal import call_refusal
from runtime.grpc.message_inflate import inflate
from runtime.grpc.service import InferenceServicer, details, tolerant_deserializer
from runtime.grpc.status_codes import StatusCode
from runtime.protocol import service_pb2
from runtime.restricted_api import RestrictedApis

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
_PREFIX = struct.Struct(">BI")  # compressed flag, message length
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# grpc-message is percent-encoded; spaces are too, since HTTP/2 stacks strip a header value's trailing ones
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def _metadata(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str | bytes]]:
    """The call's custom metadata, as grpcio hands it over (``-bin`` values decoded to bytes)."""
    metadata: list[tuple[str, str | bytes]] = []
    for raw_key, raw_value in headers:
        key = raw_key.decode("latin-1")
        if key.startswith(":") or key in ("content-type", "te", "grpc-timeout", "grpc-encoding",
                                          "grpc-accept-encoding", "user-agent", "content-length"):
            continue
        if key.endswith("-bin"):
            try:
                metadata.append((key, base64.b64decode(raw_value + b"=" * (-len(raw_value) % 4))))
            except ValueError:  # not base64: handed over as sent
                metadata.append((key, raw_value))
        else:
            metadata.append((key, raw_value.decode("latin-1")))
    return metadata


def _timeout(text: str) -> float | None:
    """``grpc-timeout`` (``<at most 8 digits><unit>``, as gRPC's spec writes it) in seconds; None if absent;
    INVALID_ARGUMENT if malformed (a value of thousands of digits is not a number to convert)."""
    if not text:
        return None
    digits = text[:-1]
    if not 1 <= len(digits) <= 8 or not digits.isascii() or not digits.isdigit() or text[-1] not in _TIMEOUT_UNITS:
        raise CallEnded(StatusCode.INVALID_ARGUMENT, f"invalid grpc-timeout {text[:32]!r}")
    return int(digits) * _TIMEOUT_UNITS[text[-1]]


class GrpcAsgiApp:
    """The servicer's methods, each an ASGI HTTP/2 request."""

    def __init__(self, servicer: InferenceServicer, max_message_bytes: int, auth: TokenAuth | None = None,
                 restrictions: RestrictedApis | None = None,
                 inflating_max_bytes: int = DEFAULT_STREAMS_MAX_BYTES) -> None:
        """``inflating_max_bytes``: what every call together may be decompressing at once."""
        self.servicer = servicer
        self.max_message_bytes = max_message_bytes
        self.inflating = ByteGate(inflating_max_bytes)
        self.auth = auth
        self.restrictions = restrictions
        descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        self.methods = {method.name: (getattr(servicer, method.name),
                                      tolerant_deserializer(getattr(service_pb2, method.input_type.name)),
                                      method.client_streaming)
                        for method in descriptor.methods}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = dict(scope["headers"])
        metadata = _metadata(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "trailers": True,
                    "headers": [(b"content-type", b"application/grpc"),
                                (b"grpc-accept-encoding", b"identity,deflate,gzip")]})
        code, message = StatusCode.OK, ""
        try:
            service, _, name = scope["path"].lstrip("/").partition("/")
            if service != SERVICE or name not in self.methods:
                raise CallEnded(StatusCode.UNIMPLEMENTED, f"Method not found: {scope['path']}")
            self._check_call(name, metadata)
            handler, deserialize, streaming = self.methods[name]
            encoding = headers.get(b"grpc-encoding", b"identity").decode("latin-1")
            timeout = _timeout(headers.get(b"grpc-timeout", b"").decode("latin-1"))
            messages = self._messages(receive, encoding)
            context = ServicerCallContext(metadata)
            try:
                async with asyncio.timeout(timeout):
                    if streaming:
                        async for response in handler(_decoded(messages, deserialize), context):
                            await self._send_message(send, response)
                    else:
                        request = await anext(messages, None)
                        if request is None:
                            raise CallEnded(StatusCode.INTERNAL, "the call sent no request message")
                        if await anext(messages, None) is not None:
                            raise CallEnded(StatusCode.UNIMPLEMENTED,
                                            "a unary call sent more than one request message")
                        await self._send_message(send, await handler(deserialize(request), context))
            except TimeoutError:
                raise CallEnded(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except CallEnded as ended:
            code, message = ended.code, ended.message
        except Exception:  # noqa: BLE001 - never leak a traceback to the client
            logger.exception("unexpected error serving %s", scope["path"])
            code, message = StatusCode.INTERNAL, "internal server error"
        trailers = [(b"grpc-status", str(code.value[0]).encode())]
        if message:
            trailers.append((b"grpc-message", quote(details(message), safe=_MESSAGE_SAFE).encode()))
        await send({"type": "http.response.body", "body": b"", "more_body": False})  # then the trailers
        await send({"type": "http.response.trailers", "headers": trailers, "more_trailers": False})

    def _check_call(self, name: str, metadata: list[tuple[str, Any]]) -> None:
        refusal = call_refusal(self.auth, self.restrictions, name, metadata)
        if refusal is not None:
            raise refusal

    async def _messages(self, receive: Callable, encoding: str) -> AsyncIterator[bytes]:
        """The request's messages as they arrive (a stream's: one at a time, so that backpressure holds)."""
        buffer = bytearray()
        more = True
        while more or buffer:
            while more and len(buffer) < _PREFIX.size:
                chunk, more = await _body(receive)
                buffer += chunk
            if len(buffer) < _PREFIX.size:
                if buffer:
                    raise CallEnded(StatusCode.INTERNAL, "the request ended inside a message")
                return
            compressed, length = _PREFIX.unpack_from(buffer)
            if length > self.max_message_bytes:
                raise CallEnded(StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max "
                                                               f"({length} vs. {self.max_message_bytes})")
            while more and len(buffer) < _PREFIX.size + length:
                chunk, more = await _body(receive)
                buffer += chunk
            if len(buffer) < _PREFIX.size + length:
                raise CallEnded(StatusCode.INTERNAL, "the request ended inside a message")
            payload = bytes(buffer[_PREFIX.size:_PREFIX.size + length])
            del buffer[:_PREFIX.size + length]
            if compressed:
                payload = await inflate(payload, encoding, self.max_message_bytes, self.inflating)
            yield payload

    async def _send_message(self, send: Callable, message: Any) -> None:
        payload = message.SerializeToString()
        if len(payload) > self.max_message_bytes:
            raise CallEnded(StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(payload)} vs. "
                                                           f"{self.max_message_bytes})")
        await send({"type": "http.response.body", "body": _PREFIX.pack(0, len(payload)) + payload,
                    "more_body": True})


async def _body(receive: Callable) -> tuple[bytes, bool]:
    """The next piece of the request body, and whether more follows."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise asyncio.CancelledError  # the client is gone: nothing more to read or answer
    return message.get("body", b""), message.get("more_body", False)


async def _decoded(messages: AsyncIterator[bytes], deserialize: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    async for payload in messages:
        yield deserialize(payload)
