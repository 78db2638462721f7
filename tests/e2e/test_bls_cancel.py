"""``cancel()`` on the iterator a decoupled BLS call returns (python_backend 2.57, #398): the model called sees
``is_cancelled()``, and its responses, its final one included, still reach the caller. Triton's own cases
(qa/L0_backend_python/decoupled: ``decoupled_bls_cancel``, ``decoupled_bls_async_cancel``,
``decoupled_bls_cancel_after_complete`` over ``response_sender_until_cancelled``), their models as Triton's QA
writes them, run through tritonclient's gRPC stream as its test does."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support import ServerProcess, write_model

UNTIL_CANCELLED_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: True }
input [
  { name: "MAX_RESPONSE_COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""
UNTIL_CANCELLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        input = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
        max_response_count = pb_utils.get_input_tensor_by_name(request, "MAX_RESPONSE_COUNT").as_numpy()[0]
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0]
        ignore_cancel = pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL").as_numpy()[0]
        response_sender = request.get_response_sender()
        sent = 0
        while True:
            if not ignore_cancel and request.is_cancelled():
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    message="request has been cancelled", code=pb_utils.TritonError.CANCELLED))
                response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                break
            output = pb_utils.Tensor("OUTPUT", np.array([input[0]], np.int32))
            response = pb_utils.InferenceResponse(output_tensors=[output])
            if sent + 1 == max_response_count:
                response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                break
            response_sender.send(response)
            sent += 1
            time.sleep(delay / 1000)
        return None
"""
CALLER_CONFIG = """
backend: "python"
input [
  { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "MAX_SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IGNORE_CANCEL" data_type: TYPE_BOOL dims: [ 1 ] }
]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IS_CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] }
]
instance_group [ { count: 1 kind : KIND_CPU } ]
"""
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    {define} execute(self, requests):
        max_sum = pb_utils.get_input_tensor_by_name(requests[0], "MAX_SUM").as_numpy().flat[0]
        input = pb_utils.get_input_tensor_by_name(requests[0], "INPUT")
        ignore_cancel = pb_utils.get_input_tensor_by_name(requests[0], "IGNORE_CANCEL")
        delay = pb_utils.Tensor("DELAY", np.array([50], dtype=np.int32))
        max_response_count = pb_utils.Tensor("MAX_RESPONSE_COUNT", np.array([20], dtype=np.int32))
        infer_request = pb_utils.InferenceRequest(
            model_name="response_sender_until_cancelled",
            inputs=[input, max_response_count, delay, ignore_cancel], requested_output_names=["OUTPUT"])
        response_stream = {call}
        is_cancelled = False
        error = None
        response_sum = 0
        for infer_response in response_stream:
            if infer_response.has_error():
                if infer_response.error().code() == pb_utils.TritonError.CANCELLED:
                    is_cancelled = True
                else:
                    error = infer_response.error()
                break
            out = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT").as_numpy()[0]
            response_sum += out
            if response_sum >= max_sum:
                response_stream.cancel()
        if {after_complete} and not error:  # a cancel after the last response does nothing
            try:
                response_stream.cancel()
            except Exception as e:
                error = pb_utils.TritonError(message=str(e), code=pb_utils.TritonError.INTERNAL)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("SUM", np.array([response_sum], dtype=np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([is_cancelled], dtype=np.bool_))], error=error)]
"""
CALLERS = {
    "decoupled_bls_cancel": dict(define="def", call="infer_request.exec(decoupled=True)", after_complete=False),
    "decoupled_bls_async_cancel": dict(define="async def", call="await infer_request.async_exec(decoupled=True)",
                                       after_complete=False),
    "decoupled_bls_cancel_after_complete": dict(define="async def",
                                                call="await infer_request.async_exec(decoupled=True)",
                                                after_complete=True),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("bls-cancel") / "models"
    write_model(repository, "response_sender_until_cancelled", UNTIL_CANCELLED_CONFIG,
                {"1/model.py": UNTIL_CANCELLED})
    for name, parts in CALLERS.items():
        write_model(repository, name, CALLER_CONFIG, {"1/model.py": CALLER.format(**parts)})
    with ServerProcess(repository, strict=True) as process:
        yield process


def _sum_and_cancelled(server: ServerProcess, model: str, max_sum: int, ignore_cancel: bool) -> tuple[int, bool]:
    """As Triton's test: one request on a gRPC stream (INPUT 1, so each response adds 1)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs = []
        for name, value in (("INPUT", np.array([1], np.int32)), ("MAX_SUM", np.array([max_sum], np.int32)),
                            ("IGNORE_CANCEL", np.array([ignore_cancel], np.bool_))):
            tensor = grpcclient.InferInput(name, [1], "BOOL" if value.dtype == np.bool_ else "INT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer(model, inputs)
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    return int(result.as_numpy("SUM")[0]), bool(result.as_numpy("IS_CANCELLED")[0])


@pytest.mark.parametrize("model", ["decoupled_bls_cancel", "decoupled_bls_async_cancel"])
def test_decoupled_bls_cancel(server, model):
    assert _sum_and_cancelled(server, model, 10, ignore_cancel=False) == (10, True)


@pytest.mark.parametrize("model", ["decoupled_bls_cancel", "decoupled_bls_async_cancel"])
def test_decoupled_bls_ignore_cancel(server, model):
    """The model called does not look: all of its 20 responses come, and no CANCELLED error."""
    assert _sum_and_cancelled(server, model, 10, ignore_cancel=True) == (20, False)


def test_decoupled_bls_cancel_after_cancellation(server):
    assert _sum_and_cancelled(server, "decoupled_bls_cancel_after_complete", 10, ignore_cancel=False) == (10, True)


def test_decoupled_bls_cancel_after_completion(server):
    """MAX_SUM 25 is never reached (20 responses): the stream ends on its own, and a cancel then is no error."""
    assert _sum_and_cancelled(server, "decoupled_bls_cancel_after_complete", 25, ignore_cancel=False) == (20, False)
