"""Lone HTTP infer requests with binary tensors served on the lanes (runtime/http/lane_route.py,
runtime/native/http_lane.h): each answer byte for byte the core's (the same outputs asked of the core with the input
as JSON data, which never takes a lane), whatever the model does, counted in the model's statistics; every request a
lane cannot serve exactly so still served by the core; with gRPC served otherwise or not at all, the same.

Which served a request is read from the metrics (``serverless_triton_lane_requests_total``, ``_lane_executing``,
``_lane_open``), so that each test here fails with the lanes off (``--grpc-native-lanes false``); and a lane's
requests are never queued: each adds exactly 1 ns to its model's queue time, where the core's add their time in the
queue."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.test_native_lanes import (  # noqa: F401 - pytestmark: skipped where the edge is not built
    CONFIG,
    MODEL,
    a_lane_took,
    executing_on_lane,
    pytestmark,
    queue_counts,
    served_on_lane,
)
from tests.support import ServerProcess, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http-lanes")
    write_model(folder / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    write_model(folder / "models", "pair", CONFIG + 'instance_group [ { kind: KIND_CPU count: 2 } ]\n',
                {"1/model.py": MODEL})
    with ServerProcess(folder / "models", strict=True, env={"LANES_MARK": str(folder / "mark")}) as process:
        process.mark = folder / "mark"
        yield process


def _post(server: ServerProcess, data: np.ndarray, outputs: list[str] | None, binary_input: bool,
          request_id: str = "call-7", timeout: float = 30, model: str = "lanes") -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of tritonclient's request (outputs as binary data; none named: all of them, which
    tritonclient asks with ``binary_data_output``)."""
    tensor = httpclient.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary_input)
    requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs] \
        if outputs is not None else None
    body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor], requested,
                                                                             request_id=request_id)
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    connection = http.client.HTTPConnection(server.http_url, timeout=timeout)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        response = connection.getresponse()
        kept = {k.lower(): v for k, v in response.getheaders() if k.lower() != "date"}
        return response.status, kept, response.read()
    finally:
        connection.close()


SMALL = np.array([[1.5, 2.0, 3.0, 4.0]], np.float32)
LARGE = np.arange(3 * 6000, dtype=np.float32).reshape(3, 6000)  # 72 KB: written into the worker's buffer


@pytest.mark.parametrize("data", [SMALL, LARGE], ids=["inline", "in the buffer"])
@pytest.mark.parametrize("outputs", [None, ["NEG", "DOUBLE"], ["SAME"]], ids=["all", "two, reversed", "its input"])
def test_a_lone_binary_request_is_answered_on_a_lane_byte_for_byte_as_the_core_answers_it(server, data, outputs):
    status, headers, body = served_on_lane(server, lambda: _post(server, data, outputs, binary_input=True))
    assert status == 200
    assert (status, headers, body) == _post(server, data, outputs, binary_input=False)
    header = json.loads(body[:int(headers["inference-header-content-length"])])
    assert header["id"] == "call-7" and header["model_version"] == "1"


def test_a_request_id_is_written_as_the_core_writes_it(server):
    odd = 'quote " backslash \\ newline \n tab \t bell \x07 accent é'
    lane = served_on_lane(server, lambda: _post(server, SMALL, ["SAME"], binary_input=True, request_id=odd))
    assert lane == _post(server, SMALL, ["SAME"], binary_input=False, request_id=odd)


@pytest.mark.parametrize("first", [-1.0, -4.0, -5.0], ids=["model's error", "response parameters", "output missing"])
def test_what_a_lane_does_not_write_itself_is_answered_as_the_core_answers_it(server, first):
    data = SMALL.copy()
    data[0, 0] = first
    outputs = ["NEG"] if first == -5.0 else None
    lane = a_lane_took(server, lambda: _post(server, data, outputs, binary_input=True))
    assert lane == _post(server, data, outputs, binary_input=False)
    assert lane[0] == (200 if first == -4.0 else 500)


def test_a_request_that_is_not_plain_goes_through_the_core(server):
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))  # a plain one is a lane's
    before, served = queue_counts(server), server.lanes("lanes")[2]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("IN", list(SMALL.shape), "FP32")
        tensor.set_data_from_numpy(SMALL, binary_data=True)
        answer = client.infer("lanes", [tensor], outputs=[httpclient.InferRequestedOutput("NEG", binary_data=False)])
        assert answer.as_numpy("NEG").tolist() == (-SMALL).tolist()  # an output as JSON: the core's
    finally:
        client.close()
    assert queue_counts(server)[1] > before[1] + 1
    wrong = SMALL.reshape(1, 2, 2)  # a shape the config does not allow
    assert _post(server, wrong, None, binary_input=True) == _post(server, wrong, None, binary_input=False)
    assert server.lanes("lanes")[2] == served


def test_a_model_of_several_instances_is_served_by_the_core(server):
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))  # the lanes follow the offer
    assert server.lanes("pair") == (0, 0, 0)  # and it has none
    for _ in range(3):
        time.sleep(0.02)
        before = queue_counts(server, "pair")
        assert _post(server, SMALL, None, binary_input=True, model="pair")[0] == 200
        assert queue_counts(server, "pair")[1] > before[1] + 1  # queued: the core ran it, on either instance
    assert server.lanes("pair") == (0, 0, 0)


def test_requests_that_come_together_are_answered_alike_whichever_serves_them(server):
    expected = _post(server, LARGE, ["DOUBLE"], binary_input=False)
    assert served_on_lane(server, lambda: _post(server, LARGE, ["DOUBLE"], binary_input=True)) == expected
    answers = []

    def client() -> None:
        for _ in range(20):
            answers.append(_post(server, LARGE, ["DOUBLE"], binary_input=True))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(60)
    assert len(answers) == 80 and all(answer == expected for answer in answers)
    assert served_on_lane(server, lambda: _post(server, LARGE, ["DOUBLE"], binary_input=True)) == expected


@pytest.mark.parametrize("first, words", [(-2.0, "worker process exited with code 3; it is being restarted"),
                                          (-3.0, "execute did not finish within 2s; its worker is being restarted")],
                         ids=["worker dies", "worker hangs"])
def test_a_lost_worker_fails_the_request_in_the_cores_words_and_a_new_one_serves_the_next(server, first, words):
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))
    data = SMALL.copy()
    data[0, 0] = first
    started = time.monotonic()
    status, _, body = _post(server, data, None, binary_input=True)
    assert (status, json.loads(body)) == (500, {"error": f"model 'lanes' instance 0: {words}"})
    assert time.monotonic() - started < 8
    deadline = time.monotonic() + 30
    while _post(server, SMALL, None, binary_input=False)[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))  # the new worker's lane


def test_a_client_that_leaves_is_seen_by_the_model(server):
    data = SMALL.copy()
    data[0, 0] = -7.0
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))  # the lane is open
    before, lane_served = queue_counts(server), server.lanes("lanes")[2]
    with pytest.raises(TimeoutError):
        _post(server, data, None, binary_input=True, timeout=0.3)
    deadline = time.monotonic() + 5
    while not server.mark.exists() or queue_counts(server)[0] == before[0]:
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.02)
    assert queue_counts(server) == (before[0] + 1, before[1] + 1)
    assert server.lanes("lanes")[2] == lane_served + 1  # a lane served it


@pytest.mark.parametrize("header, error", [
    (b'{"inputs":[{"name":"IN","shape":[1,1180591620717411303424],"datatype":"FP32",'
     b'"parameters":{"binary_data_size":16}}],"outputs":[{"name":"SAME","parameters":{"binary_data":true}}]}',
     "shape [1, 1180591620717411303424] has a dimension too large (1180591620717411303424)"),
    (b'{"id":"\\ud800","inputs":[{"name":"IN","shape":[1,4],"datatype":"FP32",'
     b'"parameters":{"binary_data_size":16}}],"outputs":[{"name":"SAME","parameters":{"binary_data":true}}]}',
     "failed to parse the request JSON buffer: JSON is malformed: unexpected end of escaped utf-16 surrogate pair "
     "(byte 13)"),
    (b'{"inputs":[{"name":"IN","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":12}}]}',
     "unexpected additional input data for model 'lanes'"),
], ids=["a dim past int64", "a lone surrogate in the id", "sizes that do not add up"])
def test_a_header_a_lane_cannot_hold_is_left_to_the_core(server, header, error):
    served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))  # a plain one is a lane's
    served = server.lanes("lanes")[2]
    connection = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        connection.request("POST", "/v2/models/lanes/infer", body=header + bytes(16),
                           headers={"Inference-Header-Content-Length": str(len(header))})
        response = connection.getresponse()
        status, body = response.status, response.read()
    finally:
        connection.close()
    assert (status, json.loads(body)) == (400, {"error": error})
    assert server.lanes("lanes")[2] == served


def test_sigterm_drains_a_request_a_lane_is_serving(tmp_path):
    write_model(tmp_path / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    server = ServerProcess(tmp_path / "models", strict=True, env={"LANES_MARK": str(tmp_path / "mark")}).start()
    try:
        served_on_lane(server, lambda: _post(server, SMALL, None, binary_input=True))
        slow = SMALL.copy()
        slow[0, 0] = -6.0  # takes a second
        answers = []
        request = executing_on_lane(server, lambda: answers.append(_post(server, slow, ["SAME"], binary_input=True)))
        assert server.stop() == 0, server.log()
        request.join(10)
    finally:
        server.stop()
    assert answers and answers[0][0] == 200, answers
    header_length = int(answers[0][1]["inference-header-content-length"])
    assert np.frombuffer(answers[0][2][header_length:], np.float32).tolist() == slow.ravel().tolist()


@pytest.fixture(scope="module")
def one_port_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one-port-lanes")
    write_model(folder / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    with ServerProcess(folder / "models", "--single-port", strict=True,
                       env={"LANES_MARK": str(folder / "mark")}) as process:
        yield process


def test_the_lanes_serve_the_one_port_as_they_serve_the_two(one_port_server):
    """An HTTP/1.1 request (served in the server's process) and a gRPC call (its connection handed to the native
    edge), each lone and plain, each answered on a lane as on the two ports."""
    server = one_port_server
    status, headers, body = served_on_lane(server, lambda: _post(server, SMALL, ["SAME"], binary_input=True))
    assert status == 200 and (status, headers, body) == _post(server, SMALL, ["SAME"], binary_input=False)

    def grpc_call() -> list[float]:
        client = grpcclient.InferenceServerClient(server.http_url)
        try:
            tensor = grpcclient.InferInput("IN", list(SMALL.shape), "FP32")
            tensor.set_data_from_numpy(SMALL)
            return client.infer("lanes", [tensor]).as_numpy("DOUBLE").tolist()
        finally:
            client.close()

    assert served_on_lane(server, grpc_call) == (2 * SMALL).tolist()


@pytest.mark.parametrize("grpc", [["--no-grpc"], ["--grpc-native-edge", "false"]],
                         ids=["without gRPC", "beside grpcio"])
def test_the_lanes_serve_http_whatever_serves_grpc(tmp_path, grpc):
    """The lanes are the data path's, not the gRPC edge's: with gRPC off, or served by grpcio, a lone binary HTTP
    request is still answered on a lane, byte for byte as the core answers it."""
    write_model(tmp_path / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    with ServerProcess(tmp_path / "models", *grpc, strict=True, env={"LANES_MARK": str(tmp_path / "mark")}) as server:
        status, headers, body = served_on_lane(server, lambda: _post(server, LARGE, ["SAME"], binary_input=True))
        assert status == 200 and (status, headers, body) == _post(server, LARGE, ["SAME"], binary_input=False)
        assert "the native lanes" not in server.log()
