"""``POST /v2/models/{name}[/versions/{n}]/infer`` on bare ASGI messages, in front of the Starlette application.

Inference is the one route every request takes, so it is served without Starlette: one regular expression
instead of the router's list, the four headers it reads picked out of the scope's list, the body taken from
``receive`` and the answer given to ``send`` as messages, the body's deadline and the watch for a client that
leaves (a queued request whose client is gone never runs) kept for all requests by one sweep
(``request_watch.py``).  Starlette's router, middleware, Request and Response objects cost about a fifth of a
small request's CPU.  Every other request (other methods on this path included) goes to the application
unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, cast

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.api import InferenceApi
from runtime.direct_path import DirectLanes, LaneAnswer
from runtime.errors import ServingError, Unsupported
from runtime.header_forward import HeaderForward
from runtime.http.body import ByteBudget, assemble_body, compress, receive_asgi_body
from runtime.http.codec import BINARY_FORMS, HEADER_LENGTH, decode_infer_request, encode_infer_response
from runtime.http.lane_route import LaneRoute
from runtime.http.request_watch import watch_request
from runtime.http.sending import Part, UnsentBytes, send_answer
from runtime.http.status import error_body, error_status
from runtime.types import InferResponse

logger = logging.getLogger(__name__)

# Large bodies are joined, inflated, decoded and encoded off the event loop, on one thread: that work
# holds the GIL anyway, and one holder at a time keeps the loop's (health probes') waits short.
_OFFLOAD_BYTES = 1 << 20
_LARGE_BODIES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-body")
# The same paths as the application's routes "/v2/models/{model_name}/infer" and
# ".../versions/{model_version:int}/infer".
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()
_READ_HEADERS = (b"content-length", b"content-encoding", b"accept-encoding", _HEADER_LENGTH, b"traceparent")
_READ_HEADER_INDEX = {name: index for index, name in enumerate(_READ_HEADERS)}
_JSON = b"application/json"
_SHORT_LENGTH = len(str(_OFFLOAD_BYTES)) - 1  # a Content-Length of this many digits is under _OFFLOAD_BYTES


class InferRoute:
    """Serves infer requests from ``service``; passes every other request to ``app``.  Given ``lanes``, a lone
    request with binary tensors is handed to them first (``lane_route.py``); given ``header_forward``, the headers
    it matches become the request's parameters."""

    def __init__(self, app: ASGIApp, service: InferenceApi, max_body_bytes: int, body_timeout: float,
                 json_budget: ByteBudget, unsent: UnsentBytes, lanes: DirectLanes | None = None,
                 header_forward: HeaderForward | None = None) -> None:
        self.app = app
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.json_budget = json_budget
        self.unsent = unsent
        self.lane_route = LaneRoute(lanes, BINARY_FORMS) if lanes is not None else None
        self.header_forward = header_forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = INFER_PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        name, version = match.groups()
        lane_route = self.lane_route
        if lane_route is not None:
            lane_route.arrived()
        try:
            status, headers, body = await self._infer(scope, receive, name, str(int(version)) if version else "")
        except ServingError as exc:
            status, headers, body = error_status(exc), [(b"content-type", _JSON)], error_body(exc.message)
        except Exception:  # noqa: BLE001 - every failure becomes an answer
            logger.exception("unexpected error serving POST %s", scope["path"])
            status, headers, body = 500, [(b"content-type", _JSON)], error_body("internal server error")
        finally:
            if lane_route is not None:
                lane_route.left()
        await send_answer(send, status, headers, body, self.unsent)

    async def _infer(self, scope: Scope, receive: Receive, name: str,
                     version: str) -> tuple[int, list[tuple[bytes, bytes]], bytes | list[Part]]:
        if self.service.is_decoupled(name, version):  # answered before the body is read
            raise Unsupported("HTTP end point doesn't support models with decoupled transaction policy")
        content_length, encoding, accept_encoding, header_length, traceparent = _read_headers(scope)
        declared = _declared_json_bytes(content_length, header_length) if _may_exceed(content_length) else 0
        budgeted = self.json_budget.take(declared) if declared > _OFFLOAD_BYTES else 0
        gather = None
        if content_length is not None and len(content_length) > _SHORT_LENGTH:  # a large body: received in place
            gather = partial(self._large_body_buffer, header_length, encoding)
        with watch_request(receive, self.body_timeout) as watched:  # the body's deadline, then the client leaving
            try:
                chunks = await receive_asgi_body(receive, content_length, self.max_body_bytes, None, gather)
                watched.body_read()
                size = len(chunks[0]) if len(chunks) == 1 else sum(len(chunk) for chunk in chunks)
                if not declared and header_length is None and size > _OFFLOAD_BYTES:  # a chunked upload
                    budgeted += self.json_budget.take(size)  # budget what arrived
                if (self.lane_route is not None and header_length is not None and size <= _OFFLOAD_BYTES
                        and encoding in (None, "", "identity") and self.lane_route.alone()):
                    # a small body is never received into a buffer: its chunks are bytes
                    served = await self.lane_route.serve(name, version, cast(list[bytes], chunks),
                                                         _number(header_length), size)
                    if served is not None:
                        return _lane_answer(served, accept_encoding or "")
                into = None
                if header_length is not None and len(chunks) > 1:  # a binary body joined: its tensors aligned
                    into = partial(self.service.tensor_buffer, aligned_at=_number(header_length))
                work = (chunks or [b""], encoding or "identity", self.max_body_bytes, header_length, name, version,
                        into)
                if size > _OFFLOAD_BYTES:
                    request, binary_default = await _off_loop(_decode, *work)
                else:
                    request, binary_default = _decode(*work)
                del chunks, work  # decoded: the received pieces go now, not when the request ends (a queued
                # request held its body twice)
            finally:
                if budgeted:
                    self.json_budget.give_back(budgeted)
            request.trace_context = traceparent  # continued by tracing in opentelemetry mode
            if self.header_forward is not None:  # after the body, as Triton: a malformed body's error comes first
                request.parameters.update(self.header_forward.parameters(scope["headers"]))
            response = await self.service.infer(request)
        if _output_bytes(response) > _OFFLOAD_BYTES:
            return await _off_loop(_encode, response, binary_default, accept_encoding or "")
        return _encode(response, binary_default, accept_encoding or "")

    def _large_body_buffer(self, header_length: str | None, encoding: str | None, size: int) -> Any:
        """Where a large body is received as it comes: a binary body's in the core's tensor pool (its tensors
        aligned, read in place by a Python worker) where there is room, else a buffer of its own."""
        if header_length is not None and encoding in (None, "", "identity"):
            pooled = self.service.tensor_buffer(size, aligned_at=_number(header_length))
            if pooled is not None:
                return pooled
        return bytearray(size)


def _read_headers(scope: Scope) -> list[str | None]:
    """Content-Length, Content-Encoding, Accept-Encoding, the JSON header's length and the W3C ``traceparent``
    (the first of each)."""
    found: list[str | None] = [None] * len(_READ_HEADERS)
    wanted = _READ_HEADER_INDEX
    for key, value in scope["headers"]:
        index = wanted.get(key)
        if index is not None and found[index] is None:
            found[index] = value.decode("latin-1")
    return found


def _output_bytes(response: InferResponse) -> int:
    """The bytes of an answer's tensors (a loop: this runs for every answer)."""
    total = 0
    for tensor in response.outputs:
        if tensor.data is not None:
            total += tensor.data.nbytes
    return total


def _decode(chunks: list[bytes] | list[memoryview], encoding: str, limit: int, header_length: str | None, name: str,
            version: str, into: Callable[[int], Any] | None) -> tuple:
    return decode_infer_request(assemble_body(chunks, encoding, limit, into), header_length, name, version)


async def _off_loop(function, *args):
    return await asyncio.get_running_loop().run_in_executor(_LARGE_BODIES, function, *args)


def _may_exceed(content_length: str | None) -> bool:
    """Whether a body may be past ``_OFFLOAD_BYTES``: unknown length, or a Content-Length of seven digits or more."""
    return content_length is None or len(content_length) > _SHORT_LENGTH


def _declared_json_bytes(content_length: str | None, header_length: str | None) -> int:
    """The JSON part's size as the request declares it, never more than its Content-Length
    (0 when unknown or malformed: such requests are refused later, or budgeted once read)."""
    content = _number(content_length)
    return content if header_length is None else min(_number(header_length), content)


def _number(text: str | None) -> int:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def _lane_answer(served: LaneAnswer | InferResponse,
                 accept_encoding: str) -> tuple[int, list[tuple[bytes, bytes]], bytes | list[Part]]:
    """A lane's answer, or the core's response to a request it gave back (its outputs all binary data)."""
    if isinstance(served, InferResponse):
        return _encode(served, True, accept_encoding)
    return _answer([served.body], served.json_length, accept_encoding)


def _encode(response: InferResponse, binary_default: bool,
            accept_encoding: str) -> tuple[int, list[tuple[bytes, bytes]], bytes | list[Part]]:
    """Status, headers and body of an infer answer: the body's parts as they lie, unless it is compressed."""
    parts, json_length = encode_infer_response(response, binary_default)
    return _answer(parts, json_length, accept_encoding)


def _answer(parts: list[Part], json_length: int | None,
            accept_encoding: str) -> tuple[int, list[tuple[bytes, bytes]], bytes | list[Part]]:
    headers = [(b"content-type", b"application/octet-stream" if json_length is not None else _JSON)]
    if json_length is not None:
        headers.append((_HEADER_LENGTH, str(json_length).encode()))
    if not accept_encoding:
        return 200, headers, parts
    payload, encoding = compress(b"".join(parts), accept_encoding)
    if encoding:
        headers.append((b"content-encoding", encoding.encode()))
    return 200, headers, payload
