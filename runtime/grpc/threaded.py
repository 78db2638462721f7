"""GRPCInferenceService on grpcio's thread-pool server, the servicer's coroutines run on the serving loop.

grpcio's synchronous server spends less CPU per call than grpc.aio (one thread polls its completion queue and hands
calls to a pool, where grpc.aio wakes the event loop for every completion): measured in ``docs/benchmarks.md``.
Each call is answered in a pool thread that hands the servicer's coroutine to the loop through :class:`LoopBridge`
and sleeps until it ends, so the servicer, and the core under it, stay on one loop exactly as with grpc.aio.

Three pools keep one kind of call from starving another: ``ModelInfer`` calls (``infer_threads`` at once, the
rest queue in the pool, inside grpcio), ``ModelStreamInfer`` streams (each holds a thread while open, and one more
to read its requests; past ``max_streams`` a new one is refused with RESOURCE_EXHAUSTED), and everything else
(health, metadata, model control). A call that ends early (client gone, deadline) cancels its coroutine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from runtime.grpc.call_context import CallEnded, ServicerCallContext
from runtime.grpc.loop_bridge import BridgedCall, LoopBridge
from runtime.grpc.service import InferenceServicer, tolerant_deserializer
from runtime.grpc.status_codes import grpcio_code
from runtime.protocol import service_pb2

CONTROL_THREADS = 16  # health, metadata, statistics, model control: a slow load leaves probes room
_END = object()


class ThreadedGrpcServer:
    """grpcio's thread-pool server serving ``servicer`` on the running loop: ``start`` and ``stop(grace)`` as a
    grpc.aio server's."""

    def __init__(self, servicer: InferenceServicer, options: list[tuple[str, Any]], infer_threads: int,
                 max_streams: int, check_call: Callable[[str, Any], CallEnded | None]) -> None:
        self.servicer = servicer
        self.bridge = LoopBridge(asyncio.get_running_loop())
        self.check_call = check_call
        self.max_streams = max_streams
        self._streams_open = 0
        self._streams_lock = threading.Lock()
        self.control_pool = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="grpc-control")
        self.infer_pool = ThreadPoolExecutor(infer_threads, thread_name_prefix="grpc-infer")
        # streams past the bound still get a thread, to be refused in
        self.stream_pool = ThreadPoolExecutor(max_streams + 4, thread_name_prefix="grpc-stream")
        self.reader_pool = ThreadPoolExecutor(max_streams + 4, thread_name_prefix="grpc-stream-read")
        self.server = grpc.server(self.control_pool, handlers=(self._method_handlers(),), options=options)

    def add_insecure_port(self, address: str) -> int:
        return self.server.add_insecure_port(address)

    async def start(self) -> None:
        self.server.start()

    async def stop(self, grace: float | None) -> None:
        """Stop taking calls, let those running finish for ``grace`` seconds, then cancel the rest."""
        stopped = self.server.stop(grace)
        await asyncio.to_thread(stopped.wait)
        for pool in (self.control_pool, self.infer_pool, self.stream_pool, self.reader_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    def _method_handlers(self) -> grpc.GenericRpcHandler:
        descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers = {}
        for method in descriptor.methods:
            deserializer = tolerant_deserializer(getattr(service_pb2, method.input_type.name))
            if method.client_streaming:
                behavior = self._stream_behavior(method.name)
                behavior.experimental_thread_pool = self.stream_pool  # type: ignore[attr-defined]
                handler = grpc.stream_stream_rpc_method_handler(behavior, request_deserializer=deserializer,
                                                               response_serializer=serialize_response)
            else:
                behavior = self._unary_behavior(method.name)
                if method.name == "ModelInfer":
                    behavior.experimental_thread_pool = self.infer_pool  # type: ignore[attr-defined]
                handler = grpc.unary_unary_rpc_method_handler(behavior, request_deserializer=deserializer,
                                                              response_serializer=serialize_response)
            handlers[method.name] = handler
        return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)

    def _context(self, name: str, context: grpc.ServicerContext) -> ServicerCallContext:
        """The servicer's view of the call, once the call passed the token and restriction checks."""
        metadata = context.invocation_metadata()
        refusal = self.check_call(name, metadata)
        if refusal is not None:
            context.abort(grpcio_code(refusal.code), refusal.message)
        return ServicerCallContext(metadata)

    def _unary_behavior(self, name: str) -> Callable:
        method = getattr(self.servicer, name)
        bridge = self.bridge

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            call = bridge.submit(method(request, self._context(name, context)))
            context.add_callback(lambda: bridge.cancel(call))
            try:
                return bridge.wait(call)
            except CallEnded as ended:
                context.abort(grpcio_code(ended.code), ended.message)
            except asyncio.CancelledError:
                context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")

        behavior.__name__ = name
        return behavior

    def _stream_behavior(self, name: str) -> Callable:
        method = getattr(self.servicer, name)

        def behavior(request_iterator: Iterator, context: grpc.ServicerContext) -> Iterator:
            call_context = self._context(name, context)
            with self._streams_lock:
                if self._streams_open >= self.max_streams:
                    refused = True
                else:
                    refused = False
                    self._streams_open += 1
            if refused:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self.max_streams} streams are open: no more are taken")
            if not context.add_callback(self._stream_closed):  # the call already ended
                self._stream_closed()
            responses = method(ThreadReadRequests(request_iterator, self.reader_pool), call_context)
            return self._responses(responses, context)

        behavior.__name__ = name
        return behavior

    def _stream_closed(self) -> None:
        with self._streams_lock:
            self._streams_open -= 1

    def _responses(self, responses: AsyncIterator, context: grpc.ServicerContext) -> Iterator:
        """The stream's responses, each taken from the loop when grpcio has sent the one before (so a client that
        does not read holds the servicer back, as with grpc.aio)."""
        bridge = self.bridge
        current: list[BridgedCall] = []
        context.add_callback(lambda: bridge.cancel(current[-1]) if current else None)
        try:
            while True:
                current[:] = [bridge.submit(_next(responses))]
                try:
                    message = bridge.wait(current[0])
                except (StopAsyncIteration, asyncio.CancelledError):
                    return
                yield message
        finally:
            try:
                bridge.run(_close(responses))
            except (asyncio.CancelledError, RuntimeError):
                pass


class ThreadReadRequests:
    """A stream's blocking request iterator read on the loop's behalf, one message per ``__anext__``, in a reader
    thread: the servicer asks for the next request only when it may take one, which keeps its backpressure."""

    def __init__(self, requests: Iterator, pool: ThreadPoolExecutor) -> None:
        self.requests = requests
        self.pool = pool

    def __aiter__(self) -> ThreadReadRequests:
        return self

    async def __anext__(self) -> Any:
        try:
            message = await asyncio.get_running_loop().run_in_executor(self.pool, next, self.requests, _END)
        except grpc.RpcError:  # the call ended (cancelled, deadline): its stream is being cancelled too
            raise asyncio.CancelledError from None
        if message is _END:
            raise StopAsyncIteration
        return message


async def _next(responses: AsyncIterator) -> Any:
    return await responses.__anext__()


async def _close(responses: AsyncIterator) -> None:
    aclose = getattr(responses, "aclose", None)
    if aclose is not None:
        await aclose()


def serialize_response(message: Any) -> bytes:
    """A response message (or a RawResponse, which writes its tensors itself) as bytes."""
    return message.SerializeToString()
