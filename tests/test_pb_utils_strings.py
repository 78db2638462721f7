"""triton_python_backend_utils takes bytes wherever Triton's pybind11 API takes a string (a BYTES tensor's element
used as a model or tensor name, as python_backend's BLS examples do): read as UTF-8 text."""

from __future__ import annotations

import json

import numpy as np

import triton_python_backend_utils as pb_utils


def test_names_given_as_bytes_are_text():
    tensor = pb_utils.Tensor(b"INPUT0", np.zeros(2, np.float32))
    assert tensor.name() == "INPUT0"
    request = pb_utils.InferenceRequest(model_name=np.array([b"add_sub"], dtype=object)[0], inputs=[tensor],
                                        requested_output_names=[b"OUTPUT0"], request_id=b"7")
    assert request.model_name() == "add_sub"
    assert request.requested_output_names() == ["OUTPUT0"]
    assert request.request_id() == "7"
    assert pb_utils.get_input_tensor_by_name(request, b"INPUT0") is tensor
    response = pb_utils.InferenceResponse([tensor])
    assert pb_utils.get_output_tensor_by_name(response, b"INPUT0") is tensor
    assert pb_utils.get_input_config_by_name({"input": [{"name": "INPUT0"}]}, b"INPUT0") == {"name": "INPUT0"}


def test_parameters_and_errors_given_as_bytes_are_text():
    request = pb_utils.InferenceRequest(model_name="m", parameters={b"key": b"value", "n": 3})
    assert json.loads(request.parameters()) == {"key": "value", "n": 3}
    assert pb_utils.InferenceRequest(model_name="m", parameters=b'{"a":1}').parameters() == '{"a":1}'
    assert pb_utils.TritonError(b"went wrong").message() == "went wrong"
