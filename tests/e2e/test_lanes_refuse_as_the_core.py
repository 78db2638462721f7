"""Hostile requests a lane could take (runtime/native/lane.h, and runtime/grpc/native_wire.h) answered exactly as
the core answers them: the same request to a server with lanes and to one without gets the same answer, and the
server and the model's worker live through it (reliability checklist 35 and 36).

Each request is sent while the model's lane is open and idle (a plain call served on it just before), so that a lane
that took it would be the one answering it."""

from __future__ import annotations

import http.client
import json
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb

from tests.e2e.test_native_lanes import pytestmark, queue_counts  # noqa: F401 - skipped where the edge is not built
from tests.support import ServerProcess, python_model_source, write_model

# Without batching, so that every dim of a shape is the client's to choose (a batched model's lane refuses a first
# dim past max_batch_size before anything else).
PROBE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
output [
  { name: "SAME" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }
]
"""
PROBE = python_model_source("""
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    pid = np.array([os.getpid()], np.int64)
    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAME", data), pb_utils.Tensor("PID", pid)]))
return responses
""")
# A batched model with no inputs: a lane reads a batch size off a request's first input.
NO_INPUTS_CONFIG = """
backend: "python"
max_batch_size: 4
input [ ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
NO_INPUTS = python_model_source("""
return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.full((1, 1), os.getpid(), np.int64))])
        for request in requests]
""")
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{lanes on: server} over one repository."""
    folder = tmp_path_factory.mktemp("lanes-differential")
    write_model(folder / "models", "probe", PROBE_CONFIG, {"1/model.py": PROBE})
    write_model(folder / "models", "noinputs", NO_INPUTS_CONFIG, {"1/model.py": NO_INPUTS})
    with ServerProcess(folder / "models", strict=True) as on, \
            ServerProcess(folder / "models", "--grpc-native-lanes", "false", strict=True) as off:
        yield {True: on, False: off}


def _message(model: str, shape: list[int] | None, raw: bytes = b"", extra: bytes = b"") -> bytes:
    """A ModelInferRequest's bytes (``extra``: fields written by hand, after the others)."""
    request = pb.ModelInferRequest(model_name=model)
    if shape is not None:
        request.inputs.add(name="IN", datatype="FP32", shape=shape)
        request.raw_input_contents.append(raw)
    return request.SerializeToString() + extra


def _grpc(server: ServerProcess, message: bytes) -> tuple:
    """(status code name, details) or ("OK", the response's outputs as lists)."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(INFER)
        try:
            answer = pb.ModelInferResponse.FromString(call(message, timeout=20))
        except grpc.RpcError as exc:
            return exc.code().name, exc.details()
    outputs = [(o.name, list(o.shape)) for o in answer.outputs]
    return "OK", answer.id, outputs


def _http(server: ServerProcess, header: dict, data: bytes) -> tuple[int, bytes]:
    body = json.dumps(header).encode()
    connection = http.client.HTTPConnection(server.http_url, timeout=20)
    try:
        connection.request("POST", "/v2/models/probe/infer", body=body + data,
                           headers={"Inference-Header-Content-Length": str(len(body))})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _worker_pid(server: ServerProcess, model: str = "probe", lanes: bool = True) -> int:
    """The model's worker process, asked with a plain call a lane serves where ``lanes`` (so that its lane is open
    and idle when this returns)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        if model == "probe":
            tensor = grpcclient.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            inputs = [tensor]
        else:
            inputs = []
        deadline = time.monotonic() + 10
        while True:  # a lane opens within a quarter second of the model's load, and only on an idle model
            time.sleep(0.02)
            before = queue_counts(server, model)
            time.sleep(0.02)
            pid = int(client.infer(model, inputs).as_numpy("PID").flat[0])
            if not lanes or queue_counts(server, model)[1] == before[1] + 1 or time.monotonic() > deadline:
                break
    finally:
        client.close()
    time.sleep(0.02)  # the lane takes a call only 10 ms after the last one ended
    return pid


def _probe_lane_served(server: ServerProcess) -> bool:
    before = queue_counts(server, "probe")
    _worker_pid(server)
    return queue_counts(server, "probe")[1] == before[1] + 1


GRPC_ATTACKS = {
    "an id that is not UTF-8": ("probe", _message("probe", [1, 2], bytes(8), extra=b"\x1a\x03\xff\xfe\xfd")),
    "an overlong UTF-8 id": ("probe", _message("probe", [1, 2], bytes(8), extra=b"\x1a\x02\xc0\xaf")),
    "a surrogate in the id": ("probe", _message("probe", [1, 2], bytes(8), extra=b"\x1a\x03\xed\xa0\x80")),
    "a shape whose count wraps to 0": ("probe", _message("probe", [1 << 40, 1 << 24])),
    "a shape whose count wraps past 2^64": ("probe", _message("probe", [1 << 40, (1 << 24) + 1], bytes(16))),
    "a dim past 2^40": ("probe", _message("probe", [1, (1 << 40) + 1])),
    "no inputs for a batched model without inputs": ("noinputs", _message("noinputs", None)),
}


@pytest.mark.parametrize("attack", list(GRPC_ATTACKS))
def test_a_hostile_grpc_call_is_answered_with_lanes_as_without(servers, attack):
    model, message = GRPC_ATTACKS[attack]
    answers, pids = {}, {}
    for lanes, server in servers.items():
        pids[lanes] = _worker_pid(server, model, lanes)
        answers[lanes] = _grpc(server, message)
        assert server.process.poll() is None, server.log()
        assert _worker_pid(server, model, lanes) == pids[lanes], "the model's worker was lost"
    assert answers[True] == answers[False]
    if model == "probe":
        assert answers[True][0] == "INVALID_ARGUMENT", answers[True]
    else:
        assert answers[True][0] == "OK", answers[True]
    assert _probe_lane_served(servers[True])


HTTP_ATTACKS = {
    "a shape whose count wraps to 0": ([1 << 40, 1 << 24], 0),
    "a shape whose count wraps past 2^64": ([1 << 40, (1 << 24) + 1], 16),
}


@pytest.mark.parametrize("attack", list(HTTP_ATTACKS))
def test_a_hostile_http_request_is_answered_with_lanes_as_without(servers, attack):
    shape, size = HTTP_ATTACKS[attack]
    header = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": size}}],
              "outputs": [{"name": "SAME", "parameters": {"binary_data": True}}]}
    answers = {}
    for lanes, server in servers.items():
        pid = _worker_pid(server, lanes=lanes)
        answers[lanes] = _http(server, header, bytes(size))
        assert server.process.poll() is None, server.log()
        assert _worker_pid(server, lanes=lanes) == pid, "the model's worker was lost"
    assert answers[True] == answers[False]
    assert answers[True][0] == 400 and b"too many elements" in answers[True][1], answers[True]
