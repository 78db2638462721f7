"""A request the server hands to ``execute`` (``model_host.received_request``, built without
``InferenceRequest.__init__``'s conversions) reads through pb_utils' API exactly as one a model builds itself."""

from __future__ import annotations

import numpy as np

import triton_python_backend_utils as pb_utils
from handlers.python import model_host


class _Host:
    def __init__(self) -> None:
        self.cancelled = {("k",)}

    def is_cancelled(self, key: object) -> bool:
        return key in self.cancelled


def _public_view(request: pb_utils.InferenceRequest) -> dict:
    return {
        "inputs": [(t.name(), t.as_numpy().dtype, t.as_numpy().tolist(), t.is_cpu()) for t in request.inputs()],
        "request_id": request.request_id(), "outputs": request.requested_output_names(),
        "parameters": request.parameters(), "correlation_id": request.correlation_id(),
        "model_name": request.model_name(), "model_version": request.model_version(), "flags": request.flags(),
        "timeout": request.timeout(),
    }


def test_a_received_request_reads_as_a_built_one() -> None:
    numbers = np.arange(4, dtype=np.float32).reshape(1, 4)
    strings = np.array([b"a", b"bc"], dtype=np.object_)
    host = _Host()
    received = model_host.received_request(("k",), host, [("INPUT0", numbers), ("TEXT", strings)], "id-7",
                                           ["OUTPUT0"], '{"p": 1}', "add_sub", 3, 42, 2, 500)
    built = pb_utils.InferenceRequest(request_id="id-7", correlation_id=42,
                                      inputs=[pb_utils.Tensor("INPUT0", numbers), pb_utils.Tensor("TEXT", strings)],
                                      requested_output_names=["OUTPUT0"], model_name="add_sub", model_version=3,
                                      flags=2, timeout=500, parameters='{"p": 1}')
    assert _public_view(received) == _public_view(built)
    assert received.is_cancelled() and not built.is_cancelled()
    assert received.get_response_sender() is received.get_response_sender()
    assert pb_utils.get_input_tensor_by_name(received, "TEXT").as_numpy() is strings  # in place, not copied
    assert pb_utils.get_input_tensor_by_name(received, b"INPUT0").as_numpy() is numbers
    assert pb_utils.get_input_tensor_by_name(received, "MISSING") is None


def test_a_received_text_array_is_converted_as_a_built_one() -> None:
    """numpy string arrays (never sent by the server, but given in process) become BYTES as Tensor() makes them."""
    text = np.array(["é", "b"])
    received = model_host.received_request(("k",), None, [("TEXT", text)], "", [], "{}", "m", 1)
    assert received.inputs()[0].as_numpy().tolist() == pb_utils.Tensor("TEXT", text).as_numpy().tolist()
    assert received.inputs()[0].as_numpy().dtype == np.object_
