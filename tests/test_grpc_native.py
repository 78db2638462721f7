"""runtime/grpc/native.py: the native edge's dispatch, each case through grpcio's client against a servicer whose
behavior the test sets (the servicer over the real core is the e2e suites' business, which run on this edge)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from runtime.grpc.call_context import CallEnded
from runtime.grpc.codec import RawResponse, SplitInferRequest, decode_infer_request
from runtime.grpc.native import NATIVE_EDGE_BUILT, NativeGrpcServer
from runtime.grpc.service import InferenceServicer, Undecodable
from runtime.tensor_pool import TensorPool
from runtime.types import InferRequest
from tests.support import first_answer_once_admitted

if not NATIVE_EDGE_BUILT and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: scripts/setup.sh builds it
    raise RuntimeError("the native gRPC edge is not built (runtime/grpc/_native_edge): see scripts/setup.sh")
pytestmark = pytest.mark.skipif(not NATIVE_EDGE_BUILT, reason="the native gRPC edge is not built (no libgrpc++)")


def raw_contents(request: Any) -> list:
    """The raw input contents of what the edge handed over: a message, its split form, or a plain request decoded."""
    return [t.raw for t in request.inputs] if isinstance(request, InferRequest) else list(request.raw_input_contents)


class ScriptedServicer(InferenceServicer):
    """ModelInfer echoes its id, or does what the id says; ModelStreamInfer answers each request as it reads it."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type] - the core is not reached
        self.cancelled = threading.Event()
        self.metadata: tuple = ()
        self.reads: list[str] = []
        self.received = None

    async def ModelInfer(self, request, context):
        self.metadata = context.invocation_metadata()
        if isinstance(request, Undecodable):  # as the real servicer's methods answer it
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error.message)
        if request.id == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        if request.id == "raise":
            raise ValueError("broken")
        if request.id == "unanswerable":
            return object()  # no message: the call must still end
        if request.id == "unsendable":  # a tensor the edge cannot read as one block of bytes
            return RawResponse(service_pb2.ModelInferResponse(id="x"), [memoryview(bytes(range(10)))[::2]])
        if request.id == "sleep":
            try:
                await asyncio.sleep(3600)
            finally:
                self.cancelled.set()
        if request.id == "tensors":
            self.received = request
            if not isinstance(request, InferRequest):  # the edge decodes a plain request itself
                decode_infer_request(request)  # raises InvalidArgument where the raw contents do not fit the inputs
            return RawResponse(service_pb2.ModelInferResponse(id="tensors"),
                               [memoryview(b"abc"), b"", *raw_contents(request)])
        if request.id.startswith("wait "):
            await asyncio.sleep(float(request.id.split()[1]))
        return service_pb2.ModelInferResponse(id=request.id, model_name=request.model_name)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator, context) -> AsyncIterator:
        async for request in request_iterator:
            self.reads.append(request.id)
            yield service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse(id=request.id))


def _refuse_without_token(method: str, metadata) -> CallEnded | None:
    if ("authorization", "Bearer right") not in metadata and method != "ServerLive":
        return CallEnded(grpc.StatusCode.UNAUTHENTICATED, "no token")
    return None


@contextlib.contextmanager
def _serving(receive_into: Callable[[int], Any] | None = None) -> Iterator[tuple]:
    """(servicer, server, loop, a stub on a channel to it); the server stopped with no grace at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servicer = ScriptedServicer()

    async def start() -> NativeGrpcServer:
        server = NativeGrpcServer(servicer, [("grpc.max_receive_message_length", 1 << 20)], 2,
                                  _refuse_without_token, receive_into)
        server.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield servicer, server, loop, service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.fixture
def served():
    with _serving() as serving:
        yield serving


TOKEN = (("authorization", "Bearer right"),)


def test_a_call_is_answered_with_its_metadata_seen_as_grpcio_hands_it_over(served):
    servicer, _, _, stub = served
    answer = stub.ModelInfer(service_pb2.ModelInferRequest(id="one", model_name="m"),
                             metadata=(*TOKEN, ("tag-bin", b"\x00\xff")), timeout=10)
    assert (answer.id, answer.model_name) == ("one", "m")
    assert ("tag-bin", b"\x00\xff") in servicer.metadata and TOKEN[0] in servicer.metadata


def test_large_tensors_arrive_as_views_of_the_message_and_answers_are_sent_from_their_pieces(served):
    servicer, _, _, stub = served
    request = service_pb2.ModelInferRequest(id="tensors", model_name="m")
    request.inputs.add(name="A", datatype="UINT8", shape=[3])
    request.inputs.add(name="B", datatype="UINT8", shape=[100_000])
    big = bytes(range(256)) * 400
    request.raw_input_contents.extend([b"xyz", big[:100_000]])
    request.parameters["p"].string_param = "kept"
    answer = stub.ModelInfer(request, metadata=TOKEN, timeout=10)
    received = servicer.received
    assert [bytes(raw) for raw in received.raw_input_contents] == [b"xyz", big[:100_000]]
    assert all(isinstance(raw, memoryview) for raw in received.raw_input_contents)
    assert (received.model_name, received.parameters["p"].string_param, len(received.inputs)) == ("m", "kept", 2)
    assert list(answer.raw_output_contents) == [b"abc", b"", b"xyz", big[:100_000]]
    del request.raw_input_contents[1:]
    request.inputs[1].shape[:] = [16]
    request.raw_input_contents.append(big[:16])  # small tensors: parsed with the message, no views
    stub.ModelInfer(request, metadata=TOKEN, timeout=10)
    assert not isinstance(servicer.received, SplitInferRequest)
    assert list(servicer.received.raw_input_contents) == [b"xyz", big[:16]]


def _tensor_request(size: int) -> tuple[service_pb2.ModelInferRequest, bytes]:
    request = service_pb2.ModelInferRequest(id="tensors", model_name="m")
    request.inputs.add(name="A", datatype="UINT8", shape=[3])
    request.inputs.add(name="B", datatype="UINT8", shape=[size])
    big = (bytes(range(256)) * (size // 256 + 1))[:size]
    request.raw_input_contents.extend([b"xyz", big])
    return request, big


def test_a_large_message_is_received_into_the_buffer_offered_each_tensor_aligned_and_read_there():
    pool = TensorPool(max_bytes=8 << 20, segment_bytes=1 << 20)
    with _serving(pool.buffer) as (servicer, _, _, stub):
        request, big = _tensor_request(300_001)  # its tensor starts at an odd offset in the message
        request.inputs.add(name="C", datatype="UINT8", shape=[70_001])
        request.raw_input_contents.append(big[:70_001])  # after a tensor of odd size
        answer = stub.ModelInfer(request, metadata=TOKEN, timeout=10)
        raws = raw_contents(servicer.received)
        assert [bytes(raw) for raw in raws] == [b"xyz", big, big[:70_001]]
        assert list(answer.raw_output_contents)[2:] == [b"xyz", big, big[:70_001]]
        arrays = [np.frombuffer(raw, dtype=np.uint8) for raw in raws]
        assert all(pool.locate(array) is not None for array in arrays)  # in the pool, in place
        assert [array.ctypes.data % 64 for array in arrays] == [0, 0, 0]  # each aligned
        assert pool.in_use() > 0
        servicer.received = raws = arrays = None
        gc.collect()
        assert pool.in_use() == 0  # back once nothing refers to it


@pytest.mark.parametrize("offer", ["raises", "too small", "none"])
def test_a_buffer_not_given_leaves_the_message_read_as_without_one(offer: str):
    def receive_into(size: int) -> Any:
        if offer == "raises":
            raise RuntimeError("no buffer")
        return bytearray(size // 2) if offer == "too small" else None

    with _serving(receive_into) as (servicer, _, _, stub):
        for _ in range(3):  # the edge goes on taking calls
            request, big = _tensor_request(300_000)
            answer = stub.ModelInfer(request, metadata=TOKEN, timeout=10)
            assert [bytes(raw) for raw in raw_contents(servicer.received)] == [b"xyz", big]
            assert list(answer.raw_output_contents)[2:] == [b"xyz", big]


def test_a_message_that_does_not_parse_is_invalid_argument(served):
    with grpc.insecure_channel(f"127.0.0.1:{served[1].port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for garbage in (b"\x3a\x05ab", b"\x0a\xff\xff", bytes([7 << 3 | 2, 2]) + b"ab\xff"):
            with pytest.raises(grpc.RpcError) as info:
                infer(garbage, metadata=TOKEN, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage


@pytest.mark.parametrize(("request_id", "code", "message"), [
    ("abort", grpc.StatusCode.NOT_FOUND, "no such model"),
    ("raise", grpc.StatusCode.UNKNOWN, "Exception calling application: broken"),
    ("unanswerable", grpc.StatusCode.UNKNOWN,
     "Exception calling application: 'object' object has no attribute 'SerializeToString'"),
])
def test_an_abort_keeps_its_status_and_an_unexpected_error_is_unknown(served, request_id, code, message):
    with pytest.raises(grpc.RpcError) as info:
        served[3].ModelInfer(service_pb2.ModelInferRequest(id=request_id), metadata=TOKEN, timeout=10)
    assert (info.value.code(), info.value.details()) == (code, message)


def test_an_answer_the_edge_cannot_send_still_ends_its_call(served):
    with pytest.raises(grpc.RpcError) as info:
        served[3].ModelInfer(service_pb2.ModelInferRequest(id="unsendable"), metadata=TOKEN, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert "contiguous" in info.value.details()


def test_a_refused_call_never_reaches_the_servicer_and_an_unknown_method_is_unimplemented(served):
    servicer, server, _, stub = served
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(service_pb2.ModelInferRequest(id="one"), timeout=10)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, "no token")
    assert servicer.metadata == ()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        unknown = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            unknown(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_message_past_the_receive_limit_is_refused_by_the_edge(served):
    with pytest.raises(grpc.RpcError) as info:
        served[3].ModelInfer(service_pb2.ModelInferRequest(id="x" * (2 << 20)), metadata=TOKEN, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_client_deadline_cancels_the_coroutine_and_the_edge_goes_on(served):
    servicer, _, _, stub = served
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(service_pb2.ModelInferRequest(id="sleep"), metadata=TOKEN, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert servicer.cancelled.wait(5)
    assert stub.ModelInfer(service_pb2.ModelInferRequest(id="after"), metadata=TOKEN, timeout=10).id == "after"


def test_a_call_cancelled_before_its_coroutine_began_is_ended_without_running_it(served):
    servicer, server, loop, stub = served
    blocked = threading.Event()
    loop.call_soon_threadsafe(lambda: (blocked.set(), time.sleep(1.0)))  # the loop takes no events meanwhile
    assert blocked.wait(5)
    with pytest.raises(grpc.RpcError) as info:  # its start and its cancellation reach the loop together
        stub.ModelInfer(service_pb2.ModelInferRequest(id="sleep"), metadata=TOKEN, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stub.ModelInfer(service_pb2.ModelInferRequest(id="after"), metadata=TOKEN, timeout=10).id == "after"
    assert not servicer.cancelled.is_set()  # the servicer never ran for it
    started = time.monotonic()
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(20)  # no call left unended to wait for
    assert time.monotonic() - started < 5


def test_many_calls_at_once_each_get_their_own_answer(served):
    stub = served[3]
    futures = [stub.ModelInfer.future(service_pb2.ModelInferRequest(id=str(n)), metadata=TOKEN, timeout=30)
               for n in range(300)]
    assert [future.result().id for future in futures] == [str(n) for n in range(300)]


def _requests(ids: list[str], release: threading.Event | None = None) -> Iterator:
    for request_id in ids:
        yield service_pb2.ModelInferRequest(id=request_id)
    if release is not None:
        release.wait(30)


def test_a_stream_answers_each_request_in_order_and_ends_when_the_client_does(served):
    servicer, _, _, stub = served
    responses = stub.ModelStreamInfer(_requests(["a", "b", "c"]), metadata=TOKEN, timeout=10)
    assert [response.infer_response.id for response in responses] == ["a", "b", "c"]
    assert servicer.reads == ["a", "b", "c"]
    empty = stub.ModelStreamInfer(_requests([]), metadata=TOKEN, timeout=10)
    assert list(empty) == []


def test_streams_past_the_bound_are_refused_and_a_closed_one_frees_its_place(served):
    stub = served[3]
    releases = [threading.Event(), threading.Event()]
    streams = [stub.ModelStreamInfer(_requests([str(n)], release), metadata=TOKEN, timeout=30)
               for n, release in enumerate(releases)]
    try:
        assert [next(stream).infer_response.id for stream in streams] == ["0", "1"]
        with pytest.raises(grpc.RpcError) as info:
            next(stub.ModelStreamInfer(_requests(["2"]), metadata=TOKEN, timeout=10))
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                             "2 streams are open: no more are taken")
        releases[0].set()
        assert list(streams[0]) == []
        answer = first_answer_once_admitted(lambda: stub.ModelStreamInfer(_requests(["3"]), metadata=TOKEN,
                                                                          timeout=10))
        assert answer.infer_response.id == "3"
    finally:
        for release in releases:
            release.set()


def test_stop_lets_a_short_call_finish_and_cuts_off_a_long_one_at_the_grace(served):
    servicer, server, loop, stub = served
    short = stub.ModelInfer.future(service_pb2.ModelInferRequest(id="wait 0.5"), metadata=TOKEN, timeout=30)
    long = stub.ModelInfer.future(service_pb2.ModelInferRequest(id="sleep"), metadata=TOKEN, timeout=30)
    time.sleep(0.2)
    started = time.monotonic()
    asyncio.run_coroutine_threadsafe(server.stop(1.5), loop).result(20)
    assert 1.0 < time.monotonic() - started < 5
    assert short.result(10).id == "wait 0.5"
    with pytest.raises(grpc.RpcError):
        long.result(10)
    assert servicer.cancelled.wait(5)


DROPPED_WHILE_SERVING = """
import asyncio, sys, threading
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from runtime.grpc.native import NativeGrpcServer
from tests.test_grpc_native import ScriptedServicer

async def main():
    server = NativeGrpcServer(ScriptedServicer(), [], 2, lambda method, metadata: None)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    call = stub.ModelInfer.future(service_pb2.ModelInferRequest(id="sleep"), timeout=1.0)
    await asyncio.sleep(0.5)  # running: its coroutine sleeps
    del server  # dropped, never stopped
    await asyncio.sleep(1.5)  # the call's deadline passes: grpc cancels it and tells the (dropped) edge
    print("serving", flush=True)

asyncio.run(main())  # then the interpreter exits with the call's server never stopped
"""


def test_a_server_dropped_while_it_serves_neither_crashes_nor_holds_the_process_at_exit():
    import subprocess
    import sys

    from tests.support import ROOT

    done = subprocess.run([sys.executable, "-c", DROPPED_WHILE_SERVING], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert "serving" in done.stdout and done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_the_edge_takes_only_a_lane_table_built_from_its_own_headers():
    """The lanes' module and the edge run one set of headers on shared objects: the table's capsule carries their
    digest, and the edge refuses anything else rather than misread it."""
    import ctypes
    import importlib

    edge_module = importlib.import_module("runtime.grpc._native_edge")
    lanes_module = importlib.import_module("runtime.native._native_lanes")
    assert edge_module.LANES_CAPSULE_NAME == lanes_module.CAPSULE_NAME
    assert edge_module.LANES_CAPSULE_NAME.startswith("runtime.native.LaneTable/")
    table = lanes_module.LaneTable()
    edge = edge_module.Edge("127.0.0.1:0", [], lanes=table.capsule())
    try:
        assert edge.port > 0
    finally:
        edge.shutdown(0)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    other_build = b"runtime.native.LaneTable/0000000000000000"
    for stranger in (table, new_capsule(id(table), other_build, None)):  # not a capsule; another build's
        with pytest.raises((TypeError, ValueError)):
            edge_module.Edge("127.0.0.1:0", [], lanes=stranger)
