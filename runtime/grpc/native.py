"""GRPCInferenceService on the native edge: grpc++'s callback server (``native_edge.cc``) carries HTTP/2 and gRPC's
framing in its own threads; the serving loop takes every call's events in one batch per wake-up and runs the same
servicer as the other front ends.

A unary call arrives as one event with its request (one task on the loop, answered with ``finish``). A stream's
first event brings its first request; the servicer asks for each next one (``read``), so a stream is read only as
fast as the servicer takes requests, and each response is written once the one before has gone (``write``, then a
WRITE_DONE event), so a client that does not read holds the servicer back, as on grpc.aio. Deadlines, cancellation
and a client that leaves arrive as CANCEL events, which cancel the call's coroutine.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any, cast

from runtime.direct_path import SERVE_AGAIN
from runtime.errors import ServingError, Status
from runtime.grpc.call_context import CallEnded, ServicerCallContext
from runtime.grpc.codec import (
    PLAIN_FORM_FIELDS,
    RAW_INPUT_FIELD,
    RawResponse,
    SplitInferRequest,
    encode_infer_response,
    plain_infer_request,
)
from runtime.grpc.service import InferenceServicer, Undecodable, details, status_code, tolerant_deserializer
from runtime.grpc.status_codes import StatusCode
from runtime.native.lanes import NativeLanes
from runtime.protocol import service_pb2
from runtime.types import InferResponse

logger = logging.getLogger(__name__)

# Not built where libgrpc++ was not found when the package was installed. Loaded only by a server that uses it:
# libgrpc++ beside grpcio's own core in one process slows grpcio's shutdown.
NATIVE_EDGE_BUILT = importlib.util.find_spec("runtime.grpc._native_edge") is not None
_OK = StatusCode.OK.value[0]
_CANCELLED = StatusCode.CANCELLED.value[0]
_UNIMPLEMENTED = StatusCode.UNIMPLEMENTED.value[0]
_UNKNOWN = StatusCode.UNKNOWN.value[0]
_INTERNAL = StatusCode.INTERNAL.value[0]
_RESOURCE_EXHAUSTED = StatusCode.RESOURCE_EXHAUSTED.value[0]
# Raw input contents handed over as views from this many bytes on (a request's together); smaller ones are
# parsed with the message: views cost 3.5 µs more than copies for add_sub's two 16-byte tensors.
SPLIT_MIN_BYTES = 64 * 1024
# The gRPC code a lane answers a model's error with, by the core's status (as the servicer maps it).
LANE_STATUS_CODES = [(status.value, status_code(status).value[0]) for status in Status]


class _Method:
    """One method of the service as the edge dispatches it."""

    __slots__ = ("name", "handler", "deserialize", "streaming")

    def __init__(self, name: str, handler: Callable, deserialize: Callable[[bytes], Any], streaming: bool) -> None:
        self.name = name
        self.handler = handler
        self.deserialize = deserialize
        self.streaming = streaming


# The edge's own option (not grpc's): bytes every call together may be inflating at once (native_inflate.h).
INFLATING_MAX_BYTES = "serverless.inflating_max_bytes"


class NativeGrpcServer:
    """The native edge serving ``servicer`` on the running loop: ``add_insecure_port``, ``start`` and
    ``stop(grace)`` as a grpc.aio server's."""

    def __init__(self, servicer: InferenceServicer, options: list[tuple[str, Any]], max_streams: int,
                 check_call: Callable[[str, Any], CallEnded | None],
                 receive_into: Callable[[int], Any] | None = None, lanes: NativeLanes | None = None) -> None:
        """``lanes``: where plain ModelInfer calls go past the loop (runtime/native/lanes.py), where every such call
        would run (no token, no restriction); they are started and drained by their owner."""
        if not NATIVE_EDGE_BUILT:
            raise RuntimeError("the native gRPC edge is not built (libgrpc++ was not found at install)")
        self.native = importlib.import_module("runtime.grpc._native_edge")
        self.loop = asyncio.get_running_loop()
        self.options = [(name, int(value)) for name, value in options]
        self.max_streams = max_streams
        self.check_call = check_call
        self.receive_into = receive_into  # where a large ModelInferRequest's tensors are received: the tensor pool
        descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        self.methods = {
            f"/{descriptor.full_name}/{method.name}": _Method(
                method.name, getattr(servicer, method.name), _deserializer(method.input_type.name),
                method.client_streaming)
            for method in descriptor.methods}
        # the methods whose requests' large tensors arrive as views (SplitInferRequest); of those, the unary one's
        # requests are read by the edge where they have its plain form (runtime.grpc.codec.plain_infer_request)
        self.split_methods = [f"/{descriptor.full_name}/{method.name}" for method in descriptor.methods
                              if method.input_type.name == "ModelInferRequest"]
        self.decode_methods = [f"/{descriptor.full_name}/{method.name}" for method in descriptor.methods
                               if method.input_type.name == "ModelInferRequest" and not method.client_streaming]
        self.edge: Any = None
        self.lanes = lanes
        self._unary: dict[int, asyncio.Task] = {}  # call id -> its task, while it runs
        self._streams: dict[int, NativeStream] = {}

    def add_insecure_port(self, address: str) -> int:
        """Bind ``address`` and start taking calls (they wait in the edge until :meth:`start`); 0: not bound."""
        self.edge = self.native.Edge(address, self.options, self.split_methods, RAW_INPUT_FIELD, SPLIT_MIN_BYTES,
                                     self.decode_methods, self._lane_table(), LANE_STATUS_CODES)
        return self.edge.port

    def _lane_table(self) -> Any:
        """The lanes' table for the edge; None (no lanes) where there are none, or where the lanes' module was
        built from other headers than the edge (a stale build: refused by the capsule's name)."""
        if self.lanes is None:
            return None
        if self.native.LANES_CAPSULE_NAME != self.lanes.native.CAPSULE_NAME:
            logger.warning("the native lanes and the gRPC edge were built from different sources: gRPC calls go "
                           "through the core (reinstall the package)")
            self.lanes = None
            return None
        return self.lanes.table_capsule()

    def adopt_connection(self, fd: int) -> bool:
        """Serve a connection accepted elsewhere (the one port's: ``runtime/listen/port_acceptor.py``) as the
        port's own; the edge owns ``fd`` from here (closed by it); False once it has shut down."""
        return bool(self.edge.adopt_connection(fd))

    async def start(self) -> None:
        self.loop.add_reader(self.edge.fileno(), self._take_events)

    async def stop(self, grace: float | None) -> bool:
        """Stop taking calls, let those running finish for ``grace`` seconds (those lanes serve among them), then
        cancel the rest."""
        grace = 0.0 if grace is None else grace
        await asyncio.to_thread(self.edge.shutdown, grace)
        self._take_events()  # the cancellations of calls cut off, calls given back by lanes
        self.loop.remove_reader(self.edge.fileno())
        for task in [*self._unary.values(), *(stream.task for stream in self._streams.values())]:
            if task is not None:
                task.cancel()
        return True

    def _take_events(self) -> None:
        for call, kind, payload in self.edge.take(self.receive_into):
            if call is None:  # UNREADABLE: its call was ended natively
                continue
            try:
                self._event(call, kind, payload)
            except Exception:  # noqa: BLE001 - one call's failure never costs the others their events
                logger.exception("unexpected error taking a gRPC call's event")
                call.finish(_INTERNAL, "internal server error", None)

    def _event(self, call: Any, kind: int, payload: Any) -> None:
        native = self.native
        if kind == native.START:
            self._start(call, payload)
        elif kind == native.LANE and self.lanes is not None:  # only lanes hand calls back
            self._hand_back(call, payload)
        elif kind == native.CANCEL:
            task = self._unary.get(call.id)
            if task is not None:
                task.cancel()
            elif (stream := self._streams.get(call.id)) is not None:
                stream.cancel()
        elif (stream := self._streams.get(call.id)) is not None:
            if kind == native.READ:
                stream.read_done(payload)
            else:
                stream.write_done(payload)

    def _hand_back(self, call: Any, payload: tuple) -> None:
        """A call a lane gave back, finished in the core's words (the lanes' settle), or served afresh."""
        assert self.lanes is not None
        fields, original = payload

        def settled(outcome: object) -> None:
            if outcome is SERVE_AGAIN:
                self._start(call, original)
            elif isinstance(outcome, ServingError):
                call.finish(status_code(outcome.status).value[0], details(outcome.message), None)
            else:
                _finish_ok(call, encode_infer_response(cast(InferResponse, outcome)))

        self.lanes.settle(fields, None, settled)

    def _start(self, call: Any, payload: bytes | None) -> None:
        method = self.methods.get(call.method)
        if method is None:
            call.finish(_UNIMPLEMENTED, "Method not found!", None)
            return
        metadata = call.metadata
        refusal = self.check_call(method.name, metadata)
        if refusal is not None:
            call.finish(refusal.code.value[0], details(refusal.message), None)
            return
        context = ServicerCallContext(metadata)
        if method.streaming:
            self._start_stream(call, payload, method, context)
            return
        if payload is None:
            call.finish(_INTERNAL, "the call sent no request message", None)
            return
        task = self.loop.create_task(method.handler(method.deserialize(payload), context))
        self._unary[call.id] = task
        task.add_done_callback(lambda done: self._unary_done(call, done))

    def _unary_done(self, call: Any, task: asyncio.Task) -> None:
        self._unary.pop(call.id, None)
        if task.cancelled():
            call.finish(_CANCELLED, "the call was cancelled", None)
            return
        error = task.exception()
        if error is None:
            _finish_ok(call, task.result())
        else:
            call.finish(*_status_of(error), None)

    def _start_stream(self, call: Any, payload: bytes | None, method: _Method, context: ServicerCallContext) -> None:
        if len(self._streams) >= self.max_streams:
            call.finish(_RESOURCE_EXHAUSTED, f"{self.max_streams} streams are open: no more are taken", None)
            return
        stream = NativeStream(self.loop, call, payload, method.deserialize)
        self._streams[call.id] = stream
        stream.task = self.loop.create_task(stream.serve(method.handler, context))
        stream.task.add_done_callback(lambda _: self._streams.pop(call.id, None))


class NativeStream:
    """A ModelStreamInfer call on the edge: its requests as an async iterator (each read when the servicer asks
    for it), its responses written one at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, call: Any, first: bytes | None,
                 deserialize: Callable[[bytes], Any]) -> None:
        self.loop = loop
        self.call = call
        self.deserialize = deserialize
        self.task: asyncio.Task | None = None
        self._first: bytes | None = first
        self._first_taken = False
        self._reading: asyncio.Future | None = None
        self._writing: asyncio.Future | None = None

    def __aiter__(self) -> NativeStream:
        return self

    async def __anext__(self) -> Any:
        if not self._first_taken:
            self._first_taken = True
            payload = self._first
            self._first = None
        else:
            self._reading = self.loop.create_future()
            payload = await self._reading if self.call.read() else None
        if payload is None:
            raise StopAsyncIteration
        return self.deserialize(payload)

    def read_done(self, payload: bytes | None) -> None:
        if self._reading is not None and not self._reading.done():
            self._reading.set_result(payload)

    def write_done(self, ok: bool) -> None:
        if self._writing is not None and not self._writing.done():
            self._writing.set_result(ok)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def serve(self, handler: Callable, context: ServicerCallContext) -> None:
        """Run the servicer over the stream and end the call with its outcome."""
        responses = handler(self, context)
        try:
            async for response in responses:
                self._writing = self.loop.create_future()
                if not self.call.write(_serialized(response)) or not await self._writing:
                    return  # the call ended (client gone, deadline): grpc has its status
            self.call.finish(_OK, "", None)
        except asyncio.CancelledError:
            self.call.finish(_CANCELLED, "the call was cancelled", None)
            raise
        except Exception as error:  # noqa: BLE001 - the call ends with its status
            self.call.finish(*_status_of(error), None)
        finally:
            await responses.aclose()


def _deserializer(type_name: str) -> Callable[[Any], Any]:
    """``type_name``'s tolerant deserializer; for ModelInferRequest, one that also takes the edge's split form
    (the message without its raw contents, and those as views) and its plain form (read by the edge: the core's
    request made from it)."""
    deserialize = tolerant_deserializer(getattr(service_pb2, type_name))
    if type_name != "ModelInferRequest":
        return deserialize

    def deserialize_split(payload: Any) -> Any:
        if type(payload) is not tuple:
            return deserialize(payload)
        if len(payload) == PLAIN_FORM_FIELDS:
            return plain_infer_request(payload)
        rest, raws = payload
        message = deserialize(rest)
        return message if isinstance(message, Undecodable) else SplitInferRequest(message, raws)

    return deserialize_split


def _finish_ok(call: Any, response: Any) -> None:
    try:
        call.finish(_OK, "", _serialized(response))
    except Exception as failure:  # noqa: BLE001 - an answer that cannot be sent: the call still ends
        call.finish(*_status_of(failure), None)


def _serialized(message: Any) -> Any:
    """A response as the edge sends it: bytes, or a RawResponse's tuple form (the edge writes the message itself)
    or its pieces (its tensors copied once, by the edge)."""
    if type(message) is not RawResponse:
        return message.SerializeToString()
    form = message.wire_form()
    return form if form is not None else message.serialized_parts()


def _status_of(error: BaseException) -> tuple[int, str]:
    """A failed call's status: an abort's own, or UNKNOWN as grpcio gives an exception it did not expect."""
    if isinstance(error, CallEnded):
        return error.code.value[0], details(error.message)
    logger.error("unexpected error in a gRPC call", exc_info=error)
    return _UNKNOWN, details(f"Exception calling application: {error}")
