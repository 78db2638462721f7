"""The gRPC front ends: the native edge (the default; runtime/grpc/native.py), grpcio's thread-pool server
(``--grpc-native-edge false``; runtime/grpc/threaded.py) and grpc.aio (and ``--grpc-infer-threads 0``): probes beside
busy inference, the stream bound, a client that gives up, SIGTERM's drain."""

from __future__ import annotations

import queue
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from runtime.server import EXIT_CUT_OFF, EXIT_GRACE_SECONDS
from tests.support import (
    IDENTITY_PYTHON_CONFIG,
    ServerProcess,
    first_answer_once_admitted,
    python_model_source,
    write_model,
)

# notes that it started (a file), sleeps IN[0] seconds (watching for cancellation, which it notes in another),
# then answers IN
SLOW = python_model_source(
    """
    with open(os.path.join(self.args["model_repository"], "started"), "a") as marker:
        marker.write(requests[0].request_id() + "\\n")
    seconds = float(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if requests[0].is_cancelled():
            with open(os.path.join(self.args["model_repository"], "cancelled"), "a") as marker:
                marker.write(requests[0].request_id() + "\\n")
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled")) for _ in requests]
        time.sleep(0.02)
    return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                        .as_numpy())]) for r in requests]
    """
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("grpc-threads") / "models"
    write_model(repository, "slow", IDENTITY_PYTHON_CONFIG, {"1/model.py": SLOW})
    return repository


FRONT_ENDS = {"native": [], "threads": ["--grpc-native-edge", "false"],
              "aio": ["--grpc-native-edge", "false", "--grpc-infer-threads", "0"]}


@pytest.fixture(scope="module", params=list(FRONT_ENDS))
def server(request, repository):
    threads = ["--grpc-infer-threads", "1"] if request.param == "threads" else []
    with ServerProcess(repository, *FRONT_ENDS[request.param], *threads, "--grpc-max-streams", "2") as process:
        yield process


def _infer(url: str, seconds: float, request_id: str = "", timeout: float | None = None) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
        return client.infer("slow", [tensor], request_id=request_id, client_timeout=timeout).as_numpy("OUT")
    finally:
        client.close()


def _wait_started(repository: Path, request_id: str, timeout: float = 30.0) -> None:
    """Until the slow model has begun executing the request ``request_id``."""
    marker = repository / "slow" / "started"
    deadline = time.monotonic() + timeout
    while not (marker.exists() and request_id in marker.read_text().split()):
        assert time.monotonic() < deadline, f"the model never began {request_id}"
        time.sleep(0.01)


def test_probes_answer_while_inference_runs(server, repository):
    """Health, readiness and metadata do not wait behind running inference (on the thread-pool server with
    ``--grpc-infer-threads 1``: one ModelInfer runs and the next waits for it)."""
    finished: queue.Queue = queue.Queue()
    slow_id = f"probes-{server.grpc_port}"
    calls = [threading.Thread(target=lambda: finished.put(("slow", _infer(server.grpc_url, 1.5, slow_id)))),
             threading.Thread(target=lambda: finished.put(("quick", _infer(server.grpc_url, 0.0))))]
    calls[0].start()
    _wait_started(repository, slow_id)  # the slow call executes: the quick one comes behind it
    calls[1].start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        started = time.monotonic()
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("slow")
        assert client.get_model_metadata("slow", as_json=True)["name"] == "slow"
        assert time.monotonic() - started < 1.0
    finally:
        client.close()
    for call in calls:
        call.join(30)
    order = [finished.get_nowait()[0] for _ in range(2)]
    assert set(order) == {"slow", "quick"}


def test_a_client_that_gives_up_cancels_its_request_in_the_model(server, repository):
    marker = repository / "slow" / "cancelled"
    request_id = f"gives-up-{server.grpc_port}"
    with pytest.raises(InferenceServerException) as info:
        _infer(server.grpc_url, 20.0, request_id, timeout=0.5)
    assert "Deadline" in info.value.message() or "DEADLINE" in str(info.value.status())
    deadline = time.monotonic() + 10
    while not (marker.exists() and request_id in marker.read_text()):
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.05)
    np.testing.assert_array_equal(_infer(server.grpc_url, 0.0), [0.0])  # and the server goes on


def _open_stream(stub, release: threading.Event):
    """A ModelStreamInfer stream that sends one request, then stays open until ``release``; its responses."""

    def requests():
        message = service_pb2.ModelInferRequest(model_name="slow", id="s")
        tensor = message.inputs.add(name="IN", datatype="FP32", shape=[1])
        tensor.contents.fp32_contents.append(0.0)
        yield message
        release.wait(30)

    return stub.ModelStreamInfer(requests(), timeout=30)


def test_streams_past_the_bound_are_refused_and_a_closed_one_frees_its_place(server, request):
    if request.node.callspec.params["server"] == "aio":
        pytest.skip("grpc.aio holds no thread per stream: its streams are not bounded")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        releases = [threading.Event(), threading.Event()]
        streams = [_open_stream(stub, release) for release in releases]
        try:
            for stream in streams:  # each is open on the server once it answered
                assert not next(stream).error_message
            with pytest.raises(grpc.RpcError) as info:
                next(_open_stream(stub, threading.Event()))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "2 streams are open" in info.value.details()
            releases[0].set()
            assert list(streams[0]) == []
            assert not first_answer_once_admitted(lambda: _open_stream(stub, releases[0])).error_message
        finally:
            for release in releases:
                release.set()


def _answer_into(outcome: queue.Queue, url: str, seconds: float, request_id: str) -> None:
    try:
        outcome.put(_infer(url, seconds, request_id))
    except InferenceServerException as exc:
        outcome.put(exc)


def _wait_until_executing(repository: Path, request_id: str) -> None:
    """Until the slow model has started on ``request_id`` (a fixed sleep lost that race on a loaded machine)."""
    marker, deadline = repository / "slow" / "started", time.monotonic() + 30
    while not (marker.exists() and request_id in marker.read_text().split()):
        assert time.monotonic() < deadline, "the model never started executing"
        time.sleep(0.02)


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
def test_sigterm_lets_a_grpc_call_finish_and_cuts_off_one_past_the_drain(tmp_path, repository, front_end):
    """The drain holds on either front end: a call shorter than the shutdown timeout gets its answer and the server
    exits 0; one longer is cut off at the timeout (its coroutine cancelled, no pool thread left waiting), and the
    server exits within the bound."""
    threads = FRONT_ENDS[front_end]
    for seconds, timeout, expected in ((1.0, "10", 0), (3600.0, "2", EXIT_CUT_OFF)):
        process = ServerProcess(repository, *threads, "--shutdown-timeout", timeout,
                                log=tmp_path / f"server-{front_end}-{timeout}.log").start()
        outcome: queue.Queue = queue.Queue()
        request_id = f"drain-{front_end}-{timeout}"
        client = threading.Thread(target=_answer_into, args=(outcome, process.grpc_url, seconds, request_id),
                                  daemon=True)
        client.start()
        _wait_until_executing(repository, request_id)
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        code = process.process.wait(timeout=float(timeout) + EXIT_GRACE_SECONDS + 10)
        took = time.monotonic() - started
        process.stop()
        assert code == expected, process.log()
        assert took < float(timeout) + 3.0, (took, process.log())
        client.join(10)
        result = outcome.get_nowait()
        if expected == 0:
            np.testing.assert_array_equal(result, [1.0])
        else:
            assert isinstance(result, InferenceServerException)
