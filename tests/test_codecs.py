"""The two protocol codecs and request validation, in process through their public functions: a request decoded
from each wire form reaches the same InferRequest, responses encode back as clients read them, and bad input is
refused with the words the conformance suite holds against Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from runtime.config.pbtxt import parse_model_config
from runtime.errors import InvalidArgument
from runtime.grpc.codec import decode_infer_request as decode_grpc
from runtime.grpc.codec import encode_infer_response as encode_grpc
from runtime.http.codec import decode_infer_request as decode_http
from runtime.http.codec import encode_infer_response as encode_http
from runtime.types import InferResponse, InferTensor
from runtime.validation import validate_request

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
SPEC = parse_model_config("""
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", "m")


def _arrays(request) -> dict[str, np.ndarray]:
    validate_request(SPEC, request)  # materializes raw contents into arrays
    return request.input_arrays()


def test_json_binary_and_grpc_forms_decode_alike():
    as_json = json.dumps({"id": "7", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                                  "data": A.tolist()}]}).encode()
    header = json.dumps({"id": "7", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                                 "parameters": {"binary_data_size": 16}}]}).encode()
    message = service_pb2.ModelInferRequest(model_name="m", id="7")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.append(A.tobytes())
    requests = [decode_http(as_json, None, "m", "")[0], decode_http(header + A.tobytes(), str(len(header)), "m", "")[0],
                decode_grpc(message)]
    for request in requests:
        assert request.id == "7" and request.model_name == "m"
        np.testing.assert_array_equal(_arrays(request)["INPUT0"], A.reshape(1, 4))


def test_responses_encode_as_clients_read_them():
    response = InferResponse("m", "1", "7", [InferTensor("OUTPUT0", "FP32", (1, 4), A.reshape(1, 4)),
                                             InferTensor("TEXT", "BYTES", (2,), np.array([b"a", b"bc"], object))])
    parts, json_length = encode_http(response, binary_default=True)
    body = b"".join(parts)
    header = json.loads(body[:json_length])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [16, 11]
    np.testing.assert_array_equal(np.frombuffer(body[json_length:json_length + 16], np.float32), A)
    message = encode_grpc(response).to_message()
    assert message.model_name == "m" and [o.name for o in message.outputs] == ["OUTPUT0", "TEXT"]
    assert list(deserialize_bytes_tensor(message.raw_output_contents[1])) == [b"a", b"bc"]


@pytest.mark.parametrize(("body", "words"), [
    ({"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
     "receiving FP16 data via JSON is not supported"),
    ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]},
     "unexpected shape for input 'INPUT0'"),
    ({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
     "data-type is 'INT32', but model 'm' expects 'FP32'"),
    ({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [9, 4], "data": [0.0] * 36}]},
     "batch-size must be <= 8"),
])
def test_bad_requests_are_refused_in_tritons_words(body, words):
    with pytest.raises(InvalidArgument, match=words):
        validate_request(SPEC, decode_http(json.dumps(body).encode(), None, "m", "")[0])


def test_grpc_values_in_another_datatypes_field_are_refused():
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]).contents.int_contents.extend([1, 2, 3, 4])
    with pytest.raises(InvalidArgument, match="of type 'INT32', expected datatype 'FP32'"):
        decode_grpc(message)


_NUMPY_TYPES = {"FP32": np.float32, "INT64": np.int64, "UINT8": np.uint8, "BOOL": bool, "FP16": np.float16}
_DATATYPES = (*_NUMPY_TYPES, "BYTES")


@settings(max_examples=200, deadline=None)
@given(inputs=st.lists(st.tuples(st.text(min_size=1, max_size=8), st.sampled_from(_DATATYPES),
                                 st.lists(st.integers(0, 3), max_size=3)), min_size=1, max_size=4),
       outputs=st.lists(st.tuples(st.text(min_size=1, max_size=8), st.booleans()), max_size=3),
       binary_output=st.booleans(), request_id=st.text(max_size=4))
def test_tritonclients_binary_requests_decode_to_what_it_was_given(inputs, outputs, binary_output, request_id):
    """tritonclient's binary form (decoded by a fast path) reaches the request its caller described."""
    from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

    given = []
    for name, datatype, shape in inputs:
        count = int(np.prod(shape))
        values = (np.array([b"x" * i for i in range(count)], dtype=object) if datatype == "BYTES"
                  else np.zeros(count, dtype=_NUMPY_TYPES[datatype]))
        tensor = InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(values.reshape(shape), binary_data=True)
        given.append(tensor)
    wanted = [InferRequestedOutput(name, binary_data=binary) for name, binary in outputs]
    body, json_size = InferenceServerClient.generate_request_body(
        given, outputs=wanted or None, request_id=request_id, parameters=None)
    if binary_output and not wanted:  # as the client asks for binary outputs when it names none
        header = json.loads(body[:json_size])
        header.setdefault("parameters", {})["binary_data_output"] = True
        text = json.dumps(header).encode()
        body, json_size = text + body[json_size:], len(text)
    request, binary_default = decode_http(body, str(json_size), "m", "")
    assert binary_default == json.loads(body[:json_size]).get("parameters", {}).get("binary_data_output", False)
    assert request.id == request_id and request.parameters == {}
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [(n, d, tuple(s)) for n, d, s in inputs]
    assert b"".join(bytes(t.raw) for t in request.inputs) == body[json_size:]
    assert [(o.name, o.parameters) for o in request.outputs] == [(n, {"binary_data": b}) for n, b in outputs]


_SIZE16 = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}


@pytest.mark.parametrize(("header", "data", "outcome"), [
    ({"inputs": [{**_SIZE16, "parameters": {"binary_data_size": True}}]}, A.tobytes(),
     "binary_data_size must be a non-negative integer"),
    ({"inputs": [{**_SIZE16, "parameters": {"binary_data_size": -16}}]}, A.tobytes(),
     "binary_data_size must be a non-negative integer"),
    ({"inputs": [_SIZE16]}, A.tobytes()[:12], "expecting 4 additional bytes"),
    ({"inputs": [_SIZE16]}, A.tobytes() + b"!", "unexpected additional input data"),
    ({"inputs": [{**_SIZE16, "datatype": "FP31"}]}, A.tobytes(), "invalid datatype for input INPUT0"),
    ({"inputs": [{**_SIZE16, "shape": [1, -4]}]}, A.tobytes(), "has a negative dimension"),
    ({"inputs": [_SIZE16], "parameters": {"triton_x": 1}}, A.tobytes(), "reserved for Triton usage"),
    ({"inputs": [_SIZE16], "parameters": {"binary_data_output": 1}}, A.tobytes(), "non-boolean as boolean"),
    ({"inputs": [_SIZE16], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True, "class_count": 2}}]},
     A.tobytes(), {"binary_data": True, "class_count": 2}),
    ({"inputs": [_SIZE16], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]}, A.tobytes(),
     "binary_data must be a boolean"),
    ({"inputs": [_SIZE16], "parameters": {"priority": 2, "binary_data_output": True}}, A.tobytes(), {"priority": 2}),
])
def test_headers_just_outside_the_binary_form_are_decoded_in_full(header, data, outcome):
    """What the fast path does not take, the general one answers: Triton's error, or every parameter kept."""
    text = json.dumps(header).encode()
    if isinstance(outcome, str):
        with pytest.raises(InvalidArgument, match=outcome):
            decode_http(text + data, str(len(text)), "m", "")
        return
    request, _ = decode_http(text + data, str(len(text)), "m", "")
    assert outcome in ([o.parameters for o in request.outputs] + [request.parameters])


def test_an_output_named_without_parameters_keeps_none():
    text = json.dumps({"inputs": [_SIZE16], "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {}}]})
    request, binary_default = decode_http(text.encode() + A.tobytes(), str(len(text)), "m", "")
    assert [(o.name, o.parameters) for o in request.outputs] == [("OUTPUT0", {}), ("OUTPUT1", {})]
    assert not binary_default
