"""The native edge's own reading and writing of ModelInfer messages (``native_wire.h``'s plain form,
``native_infer_response.h``): held to protobuf's, through ``runtime.grpc.codec``'s public functions."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.grpc.codec import (
    RAW_INPUT_FIELD,
    RawResponse,
    decode_infer_request,
    encode_infer_response,
    plain_infer_request,
)
from runtime.grpc.native import NATIVE_EDGE_BUILT
from runtime.protocol import service_pb2
from runtime.types import InferRequest, InferResponse, InferTensor

if not NATIVE_EDGE_BUILT and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: scripts/setup.sh builds it
    raise RuntimeError("the native gRPC edge is not built (runtime/grpc/_native_edge): see scripts/setup.sh")
pytestmark = pytest.mark.skipif(not NATIVE_EDGE_BUILT, reason="the native gRPC edge is not built (no libgrpc++)")


def _edge():
    return importlib.import_module("runtime.grpc._native_edge")


def _plain(message: service_pb2.ModelInferRequest | bytes) -> InferRequest | None:
    """The request the edge hands over for ``message`` when it reads it itself; None where protobuf must."""
    data = message if isinstance(message, bytes) else message.SerializeToString()
    form = _edge().plain_form(data, RAW_INPUT_FIELD)
    return None if form is None else plain_infer_request(form)


def _seen(request: InferRequest) -> tuple:
    return (request.model_name, request.model_version, request.id, request.parameters,
            [(t.name, t.datatype, tuple(t.shape), t.data, t.parameters, bytes(t.raw)) for t in request.inputs],
            [(o.name, o.parameters) for o in request.outputs])


_NAMES = st.text(max_size=6)
_SHAPES = st.lists(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1), max_size=4)


@settings(max_examples=300, deadline=None)
@given(model=_NAMES, version=_NAMES, request_id=_NAMES,
       inputs=st.lists(st.tuples(_NAMES, _NAMES, _SHAPES, st.binary(max_size=24)), max_size=4),
       outputs=st.lists(_NAMES, max_size=3))
def test_a_plain_request_is_read_as_protobuf_reads_it(model, version, request_id, inputs, outputs):
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, raw in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    for name in outputs:
        message.outputs.add(name=name)
    plain = _plain(message)
    assert plain is not None
    assert _seen(plain) == _seen(decode_infer_request(message))


def test_an_unpacked_shape_is_read_as_protobuf_reads_it():
    tensor = b"\x0a\x01A" + b"\x12\x04FP32" + b"\x18\x02\x18\x03"  # shape [2, 3], one varint field a dim
    data = b"\x0a\x01m" + bytes([5 << 3 | 2, len(tensor)]) + tensor + b"\x3a\x02ab"
    plain = _plain(data)
    assert plain is not None and plain.inputs[0].shape == (2, 3)
    assert _seen(plain) == _seen(decode_infer_request(service_pb2.ModelInferRequest.FromString(data)))


def _with(change) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="m", id="x")
    message.inputs.add(name="A", datatype="FP32", shape=[1])
    message.raw_input_contents.append(b"\0\0\0\0")
    message.outputs.add(name="B")
    change(message)
    return message


@pytest.mark.parametrize("change", [
    lambda m: m.parameters["sequence_id"].int64_param,
    lambda m: m.parameters["priority"].uint64_param,
    lambda m: m.inputs[0].parameters["shared_memory_region"].string_param,
    lambda m: m.outputs[0].parameters["classification"].int64_param,
    lambda m: m.inputs[0].contents.fp32_contents.append(1.0),
    lambda m: m.raw_input_contents.append(b"more"),
    lambda m: m.inputs.add(name="C", datatype="FP32", shape=[1]),
    lambda m: m.ClearField("raw_input_contents"),
], ids=["request parameter", "priority", "shared memory", "classification", "typed contents", "a raw content more",
        "an input more", "no raw contents"])
def test_a_request_beyond_the_plain_form_is_left_to_protobuf(change):
    assert _plain(_with(lambda m: None)) is not None
    assert _plain(_with(change)) is None


@pytest.mark.parametrize("data", [
    b"\x0a\x02\xff\xfem" + b"\x3a\x00",  # a model name that is not UTF-8: protobuf refuses it in its words
    b"\x08\x01",  # a varint where the model name's bytes belong
    b"\x62\x01x",  # an unknown field (12): protobuf keeps it
    b"\x0a\x05m",  # cut short
], ids=["not UTF-8", "wrong wire type", "unknown field", "truncated"])
def test_bytes_the_plain_reader_cannot_vouch_for_are_left_to_protobuf(data):
    assert _plain(data) is None


def _response(outputs: list[tuple[str, str, tuple, np.ndarray | None]], parameters: dict | None = None,
              model: str = "m", version: str = "1", response_id: str = "") -> InferResponse:
    tensors = []
    for name, datatype, shape, array in outputs:
        tensor = InferTensor(name, datatype, shape, array, {})
        tensor.in_shared_memory = array is None
        tensors.append(tensor)
    return InferResponse(model, version, response_id, tensors, parameters or {})


@settings(max_examples=300, deadline=None)
@given(model=_NAMES, version=_NAMES, response_id=_NAMES,
       outputs=st.lists(st.tuples(_NAMES, _SHAPES, st.none() | st.binary(max_size=40)), max_size=4))
def test_an_answer_is_written_byte_for_byte_as_protobuf_serializes_it(model, version, response_id, outputs):
    arrays = [(name, "UINT8", tuple(shape), None if raw is None else np.frombuffer(raw, np.uint8))
              for name, shape, raw in outputs]
    encoded = encode_infer_response(_response(arrays, model=model, version=version, response_id=response_id))
    form = encoded.wire_form()
    assert form is not None
    expected = RawResponse(encoded.message, encoded.raws).SerializeToString()
    assert _edge().infer_response_bytes(form) == expected
    parsed = service_pb2.ModelInferResponse.FromString(expected)
    assert [list(o.shape) for o in parsed.outputs] == [list(shape) for _, shape, _ in outputs]


def test_an_answer_with_parameters_is_left_to_protobuf():
    encoded = encode_infer_response(_response([("OUT", "FP32", (1,), np.zeros(1, np.float32))], {"n": 1}))
    assert encoded.wire_form() is None
    assert service_pb2.ModelInferResponse.FromString(encoded.SerializeToString()).parameters["n"].int64_param == 1


def test_a_tensor_that_is_not_one_block_of_bytes_is_refused_not_sent_wrong():
    before = bytearray(b"abc")
    form = ("m", "1", "", [("A", "UINT8", (3,), before), ("B", "UINT8", (5,), memoryview(bytes(range(10)))[::2])])
    with pytest.raises(BufferError):
        _edge().infer_response_bytes(form)
    before.extend(b"d")  # the output read before it is let go: a buffer still exported could not be resized


@settings(max_examples=500, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=4),
       cut=st.integers(min_value=0, max_value=200))
def test_whatever_bytes_the_plain_reader_takes_protobuf_reads_the_same(edits, cut):
    message = _with(lambda m: m.inputs.add(name="é", datatype="INT64", shape=[2, 300]))
    message.raw_input_contents.append(bytes(16))
    data = bytearray(message.SerializeToString())
    for position, value in edits:
        data[position % len(data)] = value
    data = bytes(data[: len(data) - cut % len(data)])
    plain = _plain(data)  # never a crash, whatever the bytes
    if plain is not None:
        assert _seen(plain) == _seen(decode_infer_request(service_pb2.ModelInferRequest.FromString(data)))
