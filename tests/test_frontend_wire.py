"""The front-end link's frames and packed inference messages: what goes in comes out, tensors of any layout."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runtime.config.pbtxt import parse_model_config
from runtime.errors import InvalidArgument, ServingError, Status, Unavailable
from runtime.frontends.messages import pack_request, pack_response, unpack_request, unpack_response
from runtime.frontends.wire import OUT_OF_BAND_BYTES, LinkClosed, decode, encode, open_link, receive_blocking
from runtime.types import InferRequest, InferResponse, InferTensor, RequestedOutput

DTYPES = st.sampled_from([np.float32, np.float16, np.int8, np.int64, np.uint16, np.bool_, np.float64])


def _through(message, plain: bool = False):
    parts = encode(message, plain)
    frame = b"".join(bytes(part) for part in parts)
    return decode(frame[8:])


@settings(max_examples=60, deadline=None)
@given(array=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, max_side=40)), transpose=st.booleans())
def test_responses_keep_every_tensor_exactly(array, transpose):
    if transpose:
        array = array.T  # not C-contiguous
    words = np.array([b"x" * 10, b"", "é".encode()], dtype=object)
    response = InferResponse("m", "1", "id-1", [InferTensor("A", "X", array.shape, array, {"p": 1}),
                                                InferTensor("W", "BYTES", (3,), words)], {"k": "v"})
    back = unpack_response(_through((7, "ok", pack_response(response)), plain=True)[2])
    assert back.model_name == "m" and back.id == "id-1" and back.parameters == {"k": "v"}
    np.testing.assert_array_equal(back.outputs[0].data, array)
    assert back.outputs[0].data.dtype == array.dtype and back.outputs[0].parameters == {"p": 1}
    assert list(back.outputs[1].data) == list(words)


@pytest.mark.parametrize("size", [16, OUT_OF_BAND_BYTES, 1 << 20])
def test_request_bodies_sliced_without_a_copy_travel(size):
    body = memoryview(bytes(range(256)) * (size // 256 + 1))[:size]
    request = InferRequest("m", "2", "r", [InferTensor("IN", "UINT8", (size,), None, raw=body)],
                           [RequestedOutput("OUT", {"classification": 2})], {"priority": 1})
    parts = encode(("infer", 1, "", pack_request(request)), plain=True)
    assert len(parts) == (3 if size >= OUT_OF_BAND_BYTES else 2)  # large contents ride beside the pickle
    back = unpack_request(_through(("infer", 1, "", pack_request(request)), plain=True)[3])
    assert bytes(back.inputs[0].raw) == bytes(body)
    assert back.outputs[0].parameters == {"classification": 2} and back.parameters == {"priority": 1}


def test_errors_keep_their_class_status_and_origin():
    error = Unavailable("gone", Status.RESOURCE_EXHAUSTED)
    error.executed = True
    back = _through(error)
    assert type(back) is Unavailable and back.status == Status.RESOURCE_EXHAUSTED and back.executed
    plain = _through(InvalidArgument("bad"))
    assert isinstance(plain, ServingError) and plain.status == Status.INVALID_ARG and not plain.executed


def test_model_configs_travel_with_their_protobuf():
    spec = parse_model_config('name: "m" backend: "python" max_batch_size: 4 input [ { name: "I" data_type: TYPE_FP32 '
                        'dims: [ 2 ] } ] output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] } ]', "m")
    back = _through(spec)
    assert back.to_json_dict() == spec.to_json_dict() and back.input("I") is not None


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=70_000), max_size=12))
def test_frames_cut_anywhere_arrive_whole_and_in_order(cuts):
    big = np.arange(20_000, dtype=np.float64)  # 160 KB: several reads, out of band
    messages = [{"n": 1}, ("infer", 2, "", big), "three", ("x" * 5000, 4)]
    stream = b"".join(bytes(part) for message in messages for part in encode(message))

    async def run() -> list:
        received: list = []
        ours, theirs = socket.socketpair()
        link = await open_link(ours, received.append)
        at = 0
        for size in [*cuts, len(stream)]:  # the stream written in pieces of these sizes
            theirs.sendall(stream[at : at + size])
            at += size
            await asyncio.sleep(0.001)
        theirs.close()
        await asyncio.wait_for(link.closed, 5)
        return received

    received = asyncio.run(run())
    assert len(received) == 4 and received[0] == {"n": 1} and received[2] == "three"
    np.testing.assert_array_equal(received[1][3], big)
    assert received[3] == ("x" * 5000, 4)


def test_a_length_no_message_has_closes_the_link():
    async def run() -> list:
        received: list = []
        ours, theirs = socket.socketpair()
        link = await open_link(ours, received.append)
        theirs.sendall(b"".join(bytes(part) for part in encode("fine")) + (1 << 62).to_bytes(8, "little"))
        await asyncio.wait_for(link.closed, 5)
        theirs.close()
        return received

    assert asyncio.run(run()) == ["fine"]


def test_a_blocking_read_that_ends_mid_frame_is_a_closed_link():
    ours, theirs = socket.socketpair()
    frame = b"".join(bytes(part) for part in encode({"a": 1}))
    theirs.sendall(frame + frame[:-1])
    theirs.close()
    with ours:
        assert receive_blocking(ours) == {"a": 1}
        with pytest.raises(LinkClosed):
            receive_blocking(ours)
