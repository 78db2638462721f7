"""The two protocol codecs and request validation, in process through their public functions: a request decoded
from each wire form reaches the same InferRequest, responses encode back as clients read them, and bad input is
refused with the words the conformance suite holds against Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor

from runtime.errors import InvalidArgument
from runtime.grpc.codec import decode_infer_request as decode_grpc
from runtime.grpc.codec import encode_infer_response as encode_grpc
from runtime.http.codec import decode_infer_request as decode_http
from runtime.http.codec import encode_infer_response as encode_http
from runtime.models.config import parse_model_config
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
    body, json_length = encode_http(response, binary_default=True)
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
