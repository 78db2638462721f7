"""Malformed and hostile HTTP input: each gets a precise status and message, never a crash."""

from __future__ import annotations

import gzip
import json

import httpx
import numpy as np
import pytest

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, raw_http, write_model


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        yield client


def _infer(http: httpx.Client, model: str, body: bytes | dict, headers: dict | None = None) -> httpx.Response:
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    return http.post(f"/v2/models/{model}/infer", content=content, headers=headers or {})


def _fp32_input(name: str, shape: list[int], data: list | None = None, **extra) -> dict:
    count = int(np.prod(shape)) if shape else 1
    return {"name": name, "shape": shape, "datatype": "FP32", "data": data if data is not None else [0.0] * count,
            **extra}


def _assert_error(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, message


def _good_inputs() -> list[dict]:
    return [_fp32_input("INPUT0", [1, 16]), _fp32_input("INPUT1", [1, 16])]


def test_well_formed_request_succeeds(http):
    response = _infer(http, "simple_onnx", {"inputs": _good_inputs()})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["outputs"][0]["data"] == [0.0] * 16


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"{not json", "failed to parse the request JSON"),
        (b"", "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple_onnx'"),
        (b"\xff\xfe", "failed to parse the request JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "failed to parse the request JSON"),
        (b'{"inputs": 5}', "Unable to parse 'inputs': attempt to access JSON non-array as array"),
        (b'{"inputs": [5]}', "Input must set only one of the following fields"),
    ],
    ids=["syntax", "empty", "not-utf8", "array", "deeply-nested", "inputs-not-list", "input-not-object"],
)
def test_malformed_json(http, body, fragment):
    _assert_error(_infer(http, "simple_onnx", body), 400, fragment)


def test_wrong_shape(http):
    inputs = [_fp32_input("INPUT0", [1, 15]), _fp32_input("INPUT1", [1, 16])]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400,
                  "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'simple_onnx'. "
                  "Expected [-1,16], got [1,15]. NOTE: Setting a non-zero max_batch_size")


def test_batch_larger_than_max_batch_size(http):
    inputs = [_fp32_input("INPUT0", [9, 16]), _fp32_input("INPUT1", [9, 16])]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400, "batch-size must be <= 8")


def test_negative_dimension(http):
    inputs = [_fp32_input("INPUT0", [1, 16]), {"name": "INPUT1", "shape": [-1, 16], "datatype": "FP32", "data": []}]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400, "negative dimension")


def test_shape_product_overflow(http):
    inputs = [_fp32_input("INPUT0", [1, 16]),
              {"name": "INPUT1", "shape": [2**40, 2**40], "datatype": "FP32", "data": [1.0]}]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400, "too many elements")


def test_wrong_datatype(http):
    inputs = [_good_inputs()[0], {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400,
                  "inference input 'INPUT1' data-type is 'INT32', but model 'simple_onnx' expects 'FP32'")


def test_unknown_datatype(http):
    inputs = [_good_inputs()[0], {"name": "INPUT1", "shape": [1, 16], "datatype": "FP128", "data": [0] * 16}]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400, "invalid datatype for input INPUT1")


def test_data_count_mismatch(http):
    inputs = [_good_inputs()[0], _fp32_input("INPUT1", [1, 16], data=[1.0] * 15)]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400,
                  "input 'INPUT1': tensor of shape [1, 16] needs 16 elements, got 15")


def test_data_of_wrong_json_type(http):
    inputs = [_good_inputs()[0], _fp32_input("INPUT1", [1, 16], data=["a"] * 16)]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400, "not of datatype FP32")


def test_missing_and_unexpected_inputs(http):
    _assert_error(_infer(http, "simple_onnx", {"inputs": _good_inputs()[:1]}), 400,
                  "expected 2 inputs but got 1 inputs for model 'simple_onnx'. Got input(s) ['INPUT0'], but "
                  "missing required input(s) ['INPUT1']. Please provide all required input(s).")
    inputs = [*_good_inputs(), _fp32_input("EXTRA", [1, 16])]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400,
                  "expected 2 inputs but got 3 inputs", "Got input(s) ['EXTRA','INPUT1','INPUT0']")
    inputs = [_good_inputs()[0], _fp32_input("EXTRA", [1, 16])]
    _assert_error(_infer(http, "simple_onnx", {"inputs": inputs}), 400,
                  "unexpected inference input 'EXTRA' for model 'simple_onnx'")


def test_unknown_requested_output(http):
    body = {"inputs": _good_inputs(), "outputs": [{"name": "NOPE"}]}
    _assert_error(_infer(http, "simple_onnx", body), 400, "unexpected inference output 'NOPE'")


def _binary_request(sizes: list[int], payload: bytes, header_length: str | None = None) -> tuple[bytes, dict]:
    header = json.dumps({"inputs": [
        {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": size}}
        for i, size in enumerate(sizes)
    ]}).encode()
    length = header_length if header_length is not None else str(len(header))
    return header + payload, {"Inference-Header-Content-Length": length}


def test_binary_request_succeeds(http):
    a = np.arange(16, dtype=np.float32)
    body, headers = _binary_request([64, 64], a.tobytes() * 2)
    response = _infer(http, "simple_onnx", body, headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == (a * 2).tolist()


def test_binary_data_size_does_not_match_the_tensor(http):
    body, headers = _binary_request([60, 68], b"\0" * 128)
    _assert_error(_infer(http, "simple_onnx", body, headers), 400,
                  "input byte size mismatch for input 'INPUT1' for model 'simple_onnx'. Expected 64, got 68")


def test_binary_sizes_do_not_add_up_to_the_body(http):
    body, headers = _binary_request([64, 64], b"\0" * 130)
    _assert_error(_infer(http, "simple_onnx", body, headers), 400,
                  "unexpected additional input data for model 'simple_onnx'")
    body, headers = _binary_request([64, 64], b"\0" * 100)
    _assert_error(_infer(http, "simple_onnx", body, headers), 400,
                  "unexpected size for input 'INPUT1', expecting 28 additional bytes for model 'simple_onnx'")


@pytest.mark.parametrize("value, fragment", [
    ("999999999", "inference header size should be in range (0, "),
    ("-5", "inference header size should be in range (0, "),
    ("abc", "Raw request must only have 1 input"),  # read as C's atoi does: 0, a raw binary request
    ("1e3", "failed to parse the request JSON buffer"),  # atoi: 1 byte of JSON header
])
def test_bad_header_length(http, value, fragment):
    body, headers = _binary_request([64, 64], b"\0" * 128, header_length=value)
    response = _infer(http, "simple_onnx", body, headers)
    _assert_error(response, 400, fragment)


def test_bytes_tensor_with_truncated_binary_element(http):
    header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 6}}]}).encode()
    body = header + (10).to_bytes(4, "little") + b"ab"
    response = _infer(http, "text_python", body, {"Inference-Header-Content-Length": str(len(header))})
    _assert_error(response, 400, "incomplete string data for inference input 'TEXT', expecting string of length 10 "
                                 "but only 2 bytes available")


def test_unknown_model_and_version(http):
    _assert_error(_infer(http, "no_such_model", {"inputs": []}), 404, "unknown model", "no_such_model")
    response = http.post("/v2/models/simple_onnx/versions/5/infer", content=json.dumps({"inputs": _good_inputs()}))
    _assert_error(response, 404, "version 5 is not found")
    response = http.post("/v2/models/simple_onnx/versions/abc/infer", content=json.dumps({"inputs": _good_inputs()}))
    _assert_error(response, 404, "Not Found")  # versions are numbers in Triton's routes


@pytest.mark.parametrize("path", [
    "/v2/models/../infer",
    "/v2/models/%2e%2e/infer",
    "/v2/models/..%2Fsimple_onnx/infer",
    "/v2/models/%2Fetc%2Fpasswd/infer",
    "/v2/models/%20../infer",
    "/v2/models/simple_onnx%2F..%2F..%2Fconfig/config",
])
def test_path_tricks_in_model_names(server, path):
    status, body = raw_http(server.http_port, "POST", path, b'{"inputs": []}')
    assert status in (400, 404), body
    assert "error" in json.loads(body)
    assert b"root:" not in body


def test_model_name_with_double_dots_inside_is_a_plain_name(http):
    _assert_error(_infer(http, "model..1", {"inputs": []}), 404, "'model..1' is not found")


def test_oversized_body_is_refused_before_buffering(server):
    status, body = raw_http(server.http_port, "POST", "/v2/models/simple_onnx/infer", b"{",
                            {"Content-Length": str(65 * 1024 * 1024)})
    assert status == 413
    assert "larger than the limit" in json.loads(body)["error"]


def test_gzip_bomb_is_refused(http):
    bomb = gzip.compress(b"\0" * (80 * 1024 * 1024))
    response = _infer(http, "simple_onnx", bomb, {"Content-Encoding": "gzip"})
    _assert_error(response, 413, "larger than the limit")


def test_unsupported_content_encoding(http):
    response = _infer(http, "simple_onnx", b"{}", {"Content-Encoding": "br"})
    _assert_error(response, 501, "Unsupported compression type")


def test_unknown_route_and_method(http):
    _assert_error(http.get("/v2/nothing/here"), 404, "Not Found")
    assert http.get("/v2/models/simple_onnx/infer").status_code == 405
    # the paths the infer route takes ahead of the router, and those it leaves to it, answer as Starlette's routes
    _assert_error(_infer(http, "simple_onnx/versions/abc", {"inputs": _good_inputs()}), 404, "Not Found")
    _assert_error(_infer(http, "simple_onnx/extra", {"inputs": _good_inputs()}), 404, "Not Found")
    _assert_error(http.post("/v2/models/simple_onnx/infer/", json={}), 404, "Not Found")
    _assert_error(_infer(http, "simple_onnx/versions/7", {"inputs": _good_inputs()}), 404, "simple_onnx")


def test_server_keeps_serving_after_bad_input(http):
    for body in (b"{", b"[" * 50_000, b'{"inputs": [{"name": 1}]}'):
        _infer(http, "simple_onnx", body)
    assert http.get("/v2/health/live").status_code == 200
    assert _infer(http, "simple_onnx", {"inputs": _good_inputs()}).status_code == 200


@pytest.mark.parametrize("datatype, value", [("FP32", "1.5"), ("BYTES", '"hello"')])
def test_data_nested_past_tritons_depth_limit_is_refused(tmp_path, datatype, value):
    """Triton 2.58 (server #8172, qa/L0_http test_json_recursion_depth_limit): 100 levels of nesting are served,
    101 refused with its words; the numeric fast path and the generic one alike."""
    config = IDENTITY_PYTHON_CONFIG.replace("TYPE_FP32", f"TYPE_{'STRING' if datatype == 'BYTES' else 'FP32'}")
    write_model(tmp_path / "models", "nested", config, {"1/model.py": python_model_source(
        "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name(r, 'IN')"
        ".as_numpy())]) for r in requests]")})
    with ServerProcess(tmp_path / "models") as server:
        for depth, served in ((1, True), (100, True), (101, False), (120, False)):
            data = "[" * depth + value + "]" * depth
            body = '{"inputs":[{"name":"IN","datatype":"' + datatype + '","shape":[1],"data":' + data + "}]}"
            answer = httpx.post(f"http://{server.http_url}/v2/models/nested/infer", content=body)
            if served:
                assert answer.status_code == 200, (depth, answer.text)
            else:
                assert answer.status_code == 400, (depth, answer.text)
                assert "JSON nesting depth exceeds maximum allowed limit (100)" in answer.json()["error"]
