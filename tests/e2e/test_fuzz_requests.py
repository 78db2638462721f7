"""Property-based tests: whatever a client sends to infer, over HTTP or gRPC, the answer is a success or a
client error (2xx / 4xx, gRPC codes other than INTERNAL and UNKNOWN), promptly, and the server stays up."""

from __future__ import annotations

import json
import string

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from runtime.datatypes import DATATYPES

MODELS = ["simple_onnx", "simple_int32", "text_python", "identity_python", "simple_torch"]
NAMES = ["INPUT0", "INPUT1", "IN", "TEXT", "INPUT__0", "", "x" * 300]
SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(
    max_size=20)
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=6)
                           | st.dictionaries(st.text(max_size=12), children, max_size=6), max_leaves=30)
dims = st.integers(-3, 20) | st.sampled_from([0, 2**31, 2**40 + 1, 2**62, 2**63 - 1])
shapes = st.lists(dims, max_size=4)
datatypes = st.sampled_from(sorted(DATATYPES)) | st.sampled_from(["FP128", "", "fp32", "STRING"])


@st.composite
def json_inputs(draw) -> dict:
    entry: dict = {"name": draw(st.sampled_from(NAMES)),
                   "datatype": draw(datatypes | json_values),
                   "shape": draw(shapes | json_values)}
    if draw(st.booleans()):
        entry["data"] = draw(st.lists(st.integers(-300, 300) | st.floats(allow_nan=False, width=32)
                                      | st.text(max_size=5) | st.booleans(), max_size=40) | json_values)
    if draw(st.booleans()):
        entry["parameters"] = draw(st.dictionaries(st.sampled_from(["binary_data_size", "x", "shared_memory_region"]),
                                                   json_values, max_size=2) | json_values)
    return entry


@st.composite
def json_requests(draw) -> dict:
    request: dict = {"inputs": draw(st.lists(json_inputs(), max_size=3) | json_values)}
    if draw(st.booleans()):
        request["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": st.sampled_from(NAMES + ["OUTPUT0"])},
                                                                 optional={"parameters": json_values}), max_size=2)
                                  | json_values)
    for key in ("id", "parameters"):
        if draw(st.booleans()):
            request[key] = draw(json_values)
    return request


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=20) as client:
        yield client


@pytest.fixture(scope="module")
def model_infer(server):
    channel = grpc.insecure_channel(server.grpc_url)
    yield channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                              request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
    channel.close()


def _assert_http_client_error(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert isinstance(response.json()["error"], str)


@FUZZ
@given(model=st.sampled_from(MODELS), body=st.binary(max_size=400),
       header_length=st.none() | st.text(string.digits + "-x ", max_size=6).filter(lambda t: t == t.strip()))
def test_http_any_bytes(http, model, body, header_length):
    headers = {} if header_length is None else {"Inference-Header-Content-Length": header_length}
    _assert_http_client_error(http.post(f"/v2/models/{model}/infer", content=body, headers=headers))


@FUZZ
@given(model=st.sampled_from(MODELS), body=json_values)
def test_http_any_json_value(http, model, body):
    _assert_http_client_error(http.post(f"/v2/models/{model}/infer", content=json.dumps(body).encode()))


@FUZZ
@given(model=st.sampled_from(MODELS), request=json_requests())
def test_http_request_shaped_json(http, model, request):
    _assert_http_client_error(http.post(f"/v2/models/{model}/infer", content=json.dumps(request).encode()))


@FUZZ
@given(model=st.sampled_from(MODELS), request=json_requests(), binary=st.binary(max_size=200),
       sizes=st.lists(st.integers(-5, 300) | st.sampled_from([2**62, 2**63 - 1]), min_size=1, max_size=3))
def test_http_binary_tensors(http, model, request, binary, sizes):
    inputs = [e for e in request["inputs"] if isinstance(e, dict)] if isinstance(request["inputs"], list) else []
    for entry, size in zip(inputs, sizes, strict=False):
        entry.pop("data", None)
        entry["parameters"] = {"binary_data_size": size}
    header = json.dumps(request).encode()
    response = http.post(f"/v2/models/{model}/infer", content=header + binary,
                         headers={"Inference-Header-Content-Length": str(len(header))})
    _assert_http_client_error(response)


def _call_grpc(model_infer, raw: bytes) -> None:
    try:
        model_infer(raw, timeout=20)
    except grpc.RpcError as exc:
        assert exc.code() not in SERVER_ERRORS, (exc.code(), exc.details())
        assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the server did not answer in time"


@FUZZ
@given(raw=st.binary(max_size=400))
def test_grpc_any_bytes(model_infer, raw):
    _call_grpc(model_infer, raw)


@FUZZ
@given(model=st.sampled_from(MODELS + [""]), data=st.data())
def test_grpc_request_shaped_messages(model_infer, model, data):
    message = service_pb2.ModelInferRequest(model_name=model, model_version=data.draw(st.sampled_from(["", "1", "x"])))
    for _ in range(data.draw(st.integers(0, 3))):
        tensor = message.inputs.add(name=data.draw(st.sampled_from(NAMES)),
                                    datatype=data.draw(datatypes.filter(lambda d: isinstance(d, str))),
                                    shape=data.draw(st.lists(st.integers(-3, 20) | st.sampled_from(
                                        [2**40 + 1, 2**62, 2**63 - 1]), max_size=4)))
        which = data.draw(st.sampled_from(["raw", "fp32", "int", "bytes", "none"]))
        if which == "raw":
            message.raw_input_contents.append(data.draw(st.binary(max_size=128)))
        elif which == "fp32":
            tensor.contents.fp32_contents.extend(data.draw(st.lists(st.floats(width=32), max_size=40)))
        elif which == "int":
            tensor.contents.int_contents.extend(data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)))
        elif which == "bytes":
            tensor.contents.bytes_contents.extend(data.draw(st.lists(st.binary(max_size=8), max_size=8)))
    for _ in range(data.draw(st.integers(0, 2))):
        message.outputs.add(name=data.draw(st.sampled_from(NAMES + ["OUTPUT0"])))
    if data.draw(st.booleans()):
        message.parameters["timeout"].int64_param = data.draw(st.integers(-5, 10**6))
    _call_grpc(model_infer, message.SerializeToString())


def test_server_is_still_serving_after_the_fuzzing(http):
    assert http.get("/v2/health/live").status_code == 200
    body = {"inputs": [{"name": "IN", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
    response = http.post("/v2/models/identity_python/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [1, 2]
