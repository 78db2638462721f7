"""End to end through the official tritonclient.http client against a real server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import TORCH_BIAS, TORCH_WEIGHT


def _inputs(a: np.ndarray, b: np.ndarray, binary: bool, datatype: str = "FP32") -> list[httpclient.InferInput]:
    result = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        result.append(tensor)
    return result


def test_server_health_and_metadata(http_client):
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    metadata = http_client.get_server_metadata()
    assert metadata["name"] == "triton"  # as Triton answers: tools check it
    assert "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_onnx_add_sub(http_client, binary):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = http_client.infer("simple_onnx", _inputs(a, b, binary), outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["model_name"] == "simple_onnx"
    assert response["model_version"] == "1"
    assert response["id"] == "req-7"
    carried = [("binary_data_size" in o.get("parameters", {})) for o in response["outputs"]]
    assert carried == [binary, binary]


def test_int32_json_inputs_with_binary_outputs_by_default(http_client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    result = http_client.infer("simple_int32", _inputs(a, b, binary=False, datatype="INT32"))
    assert result.as_numpy("OUTPUT0").dtype == np.int32
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_torchscript_linear(http_client):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    tensor = httpclient.InferInput("INPUT__0", [3, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = http_client.infer("simple_torch", [tensor])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), x @ TORCH_WEIGHT + TORCH_BIAS, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_python_backend_bytes_tensors(http_client, binary):
    text = np.array([b"hello", "Grüße".encode(), b""], dtype=np.object_)
    tensor = httpclient.InferInput("TEXT", [3], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("UPPER", "LENGTH")]
    result = http_client.infer("text_python", [tensor], outputs=outputs)
    upper = [x if isinstance(x, bytes) else x.encode() for x in result.as_numpy("UPPER")]  # JSON gives str
    assert upper == [b"HELLO", "GRÜSSE".encode(), b""]
    np.testing.assert_array_equal(result.as_numpy("LENGTH"), np.array([5, 7, 0], dtype=np.int32))


def test_only_requested_outputs_are_returned(http_client):
    a = np.ones((1, 16), dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1")]
    result = http_client.infer("simple_onnx", _inputs(a, a, True), outputs=outputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None


def test_model_metadata(http_client):
    metadata = http_client.get_model_metadata("simple_onnx")
    assert metadata["name"] == "simple_onnx"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ]
    python_metadata = http_client.get_model_metadata("text_python", "1")
    assert python_metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}]


def test_model_config_prints_int64_as_numbers(http_client):
    config = http_client.get_model_config("simple_onnx")
    assert config["name"] == "simple_onnx"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [16]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["count"] == 1


def test_model_readiness(http_client):
    assert http_client.is_model_ready("simple_onnx")
    assert http_client.is_model_ready("simple_onnx", "1")
    assert not http_client.is_model_ready("simple_onnx", "2")
    assert not http_client.is_model_ready("broken_syntax")
    assert not http_client.is_model_ready("no_such_model")


def test_python_backend_initialize_args(http_client):
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    args = json.loads(http_client.infer("args_python", [tensor]).as_numpy("OUT")[0])
    assert set(args) >= {
        "model_config", "model_instance_kind", "model_instance_device_id",
        "model_repository", "model_version", "model_name",
    }
    assert args["model_name"] == "args_python"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_repository"].endswith("args_python")
    config = json.loads(args["model_config"])
    assert config["name"] == "args_python"
    assert config["output"][0]["data_type"] == "TYPE_STRING"


def test_unknown_model_raises_not_found(http_client):
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("no_such_model", [tensor])
    assert info.value.status() == "404"
    assert "unknown model" in info.value.message()


def test_compressed_request_and_response(http_client):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for algorithm in ("gzip", "deflate"):
        result = http_client.infer(
            "simple_onnx",
            _inputs(a, a, True),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_text_python_refuses_non_utf8_text_with_400(http_client):
    tensor = httpclient.InferInput("TEXT", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"fine", b"\xff\xfe not utf-8"], dtype=object))
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("text_python", [tensor])
    assert info.value.status() == "400"
    assert "TEXT must be UTF-8" in info.value.message()
