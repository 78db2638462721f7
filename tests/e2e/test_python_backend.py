"""The Triton Python backend: pb_utils API and misbehaving user models."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import triton_python_backend_utils as pb_utils


def _infer(http_client, model: str):
    tensor = httpclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    return http_client.infer(model, [tensor])


def test_response_count_mismatch_fails_the_requests_not_the_server(http_client):
    with pytest.raises(InferenceServerException) as info:
        _infer(http_client, "wrong_count_python")
    assert info.value.status() == "500"
    assert "returned 0 responses for 1 requests" in info.value.message()
    assert http_client.is_server_live()


def test_execute_raising_fails_its_request_with_the_message(http_client):
    with pytest.raises(InferenceServerException) as info:
        _infer(http_client, "raising_python")
    assert info.value.status() == "500"
    # the instance's name, as Triton words it (the default instance group is named after the model)
    assert "Failed to process the request(s) for model 'raising_python_0'" in info.value.message()
    assert "ValueError: boom from user code" in info.value.message()
    assert "Traceback" not in info.value.message()


def test_error_response_keeps_its_code(http_client):
    with pytest.raises(InferenceServerException) as info:
        _infer(http_client, "error_response_python")
    assert info.value.status() == "400"
    assert info.value.message() == "IN must be positive"


def test_type_helpers_match_triton():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_to_numpy_type(8) is np.int32


def test_config_lookup_helpers():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B", "data_type": "TYPE_INT32"}]}
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(config, "B")["data_type"] == "TYPE_INT32"
    assert pb_utils.get_input_config_by_name(config, "B") is None


def test_tensor_request_and_response_objects():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("X", array)
    request = pb_utils.InferenceRequest(inputs=[tensor], request_id="r1", requested_output_names=["Y"])
    assert pb_utils.get_input_tensor_by_name(request, "X").as_numpy() is array
    assert request.get_input_tensor_by_name("missing") is None
    assert request.request_id() == "r1"
    assert request.requested_output_names() == ["Y"]
    response = pb_utils.InferenceResponse(output_tensors=[tensor])
    assert not response.has_error()
    assert response.output_tensors()[0].name() == "X"
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("nope"))
    assert failed.has_error() and failed.error().message() == "nope"


def test_dlpack_round_trip():
    import torch

    array = np.arange(4, dtype=np.float32)
    tensor = pb_utils.Tensor("X", array)
    back = pb_utils.Tensor.from_dlpack("Y", tensor.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), array)
    from_torch = pb_utils.Tensor.from_dlpack("Z", torch.arange(3, dtype=torch.int64))
    np.testing.assert_array_equal(from_torch.as_numpy(), np.arange(3))
    assert torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_string_tensors_become_bytes():
    tensor = pb_utils.Tensor("S", np.array(["a", "bc"]))
    assert tensor.as_numpy().dtype == np.object_
    assert list(tensor.as_numpy()) == [b"a", b"bc"]
    encoded = pb_utils.serialize_byte_tensor(tensor.as_numpy())
    assert list(pb_utils.deserialize_bytes_tensor(encoded.tobytes())) == [b"a", b"bc"]
