"""Plain gRPC ModelInfer calls to a Python model served on the native edge's lanes (runtime/native/lanes.py,
lane.h): answered as the core answers them over HTTP, whatever the model does (an error, response parameters,
a missing output, a worker that dies or hangs), counted in the model's statistics, and every call a lane cannot
serve exactly so still served by the core.

Which served a call is read from the metrics (``serverless_triton_lane_requests_total``, ``_lane_executing``,
``_lane_open``), so that each test here fails with the lanes off (``--grpc-native-lanes false``); and a lane's
requests are never queued: each adds 1 ns to its model's queue time (so that the field is there, as Triton's always
is), where the core's add their time in the queue."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from runtime.grpc.native import NATIVE_EDGE_BUILT
from runtime.native.lanes import IDLE_RECONCILE_SECONDS, RECONCILE_SECONDS
from runtime.server import EXIT_CUT_OFF
from tests.support import ServerProcess, python_model_source, write_model

if not NATIVE_EDGE_BUILT and os.environ.get("REQUIRE_NATIVE_GRPC_EDGE"):  # CI: scripts/setup.sh builds it
    raise RuntimeError("the native gRPC edge is not built (runtime/grpc/_native_edge): see scripts/setup.sh")
pytestmark = pytest.mark.skipif(not NATIVE_EDGE_BUILT, reason="the native gRPC edge is not built (no libgrpc++)")

CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "DOUBLE" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SAME" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "NEG" data_type: TYPE_FP32 dims: [ -1 ] }
]
parameters { key: "execute_timeout_seconds" value { string_value: "2" } }
"""
# The first element says what to do: -1 an error response, -2 the worker dies, -3 hang past the timeout, -4
# response parameters, -5 no NEG output, -6 take a second, -7 wait (1.5 s at most) for the client to leave and note
# it in the file $LANES_MARK; else the three outputs.
MODEL = python_model_source("""
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    what = float(data.flat[0])
    if what == -1:
        responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("IN may not start with -1")))
        continue
    if what == -2:
        os._exit(3)
    if what == -3:
        time.sleep(10)
    if what == -6:
        time.sleep(1)
    if what == -7:
        deadline = time.monotonic() + 1.5
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if request.is_cancelled():
            with open(os.environ["LANES_MARK"], "w") as mark:
                mark.write("cancelled")
    outputs = [pb_utils.Tensor("DOUBLE", data * 2), pb_utils.Tensor("SAME", data)]
    if what != -5:
        outputs.append(pb_utils.Tensor("NEG", -data))
    parameters = {"note": "four", "n": 4} if what == -4 else None
    responses.append(pb_utils.InferenceResponse(outputs, parameters=parameters))
return responses
""")


# A model that sends BLS requests without building one by name (its files' scan misses it): it asks "lanes".
RELAY = python_model_source("""
build = getattr(pb_utils, "Inference" + "Request")
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN")
    answer = build(model_name="lanes", inputs=[data], requested_output_names=["DOUBLE"]).exec()
    if answer.has_error():
        raise pb_utils.TritonModelException(answer.error().message())
    double = pb_utils.get_output_tensor_by_name(answer, "DOUBLE")
    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DOUBLE", double.as_numpy())]))
return responses
""")
RELAY_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "DOUBLE" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lanes")
    write_model(folder / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    write_model(folder / "models", "relay", RELAY_CONFIG, {"1/model.py": RELAY})
    with ServerProcess(folder / "models", "--trace-config", f"triton,file={folder / 'trace.json'}", strict=True,
                       env={"LANES_MARK": str(folder / "mark")}) as process:  # tracing set up, its level OFF
        process.mark = folder / "mark"
        yield process


def _grpc(server: ServerProcess, data: np.ndarray, outputs: list[str] | None = None, model: str = "lanes",
          answered: Callable[[], None] | None = None, **options) -> dict:
    """The call's outcome as a dict; ``answered`` runs as soon as the answer arrives, before it is decoded here."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs is not None else None
    try:
        response = client.infer(model, [tensor], outputs=requested, request_id="call-7", **options)
        if answered is not None:
            answered()
        return _answer(response.get_response(as_json=True), response)
    except InferenceServerException as exc:
        return {"error": exc.message(), "status": exc.status()}
    finally:
        client.close()


def _http(server: ServerProcess, data: np.ndarray, outputs: list[str] | None = None) -> dict:
    """The core's answer: an input as JSON data is never a lane's (tests/e2e/test_http_lanes.py)."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=False)
    requested = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs] \
        if outputs is not None else None
    try:
        response = client.infer("lanes", [tensor], outputs=requested, request_id="call-7")
        return _answer(response.get_response(), response)
    except InferenceServerException as exc:
        return {"error": exc.message()}
    finally:
        client.close()


def _answer(message: dict, response) -> dict:
    outputs = [(o["name"], o["datatype"], [int(d) for d in o["shape"]], response.as_numpy(o["name"]).tolist())
               for o in message["outputs"]]
    parameters = {k: _parameter(v) for k, v in (message.get("parameters") or {}).items()}
    return {"model": message["model_name"], "version": message["model_version"], "id": message["id"],
            "outputs": outputs, "parameters": parameters}


def _parameter(value):
    """A response parameter's value: as JSON has it, or out of gRPC's InferParameter (its int64 as text)."""
    if not isinstance(value, dict):
        return value
    (kind, inner), = value.items()
    return int(inner) if kind in ("int64_param", "uint64_param") else inner


def queue_counts(server: ServerProcess, model: str = "lanes") -> tuple[int, int]:
    """(requests that succeeded, ns they spent queued) so far."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
    finally:
        client.close()
    return stats["success"]["count"], stats["queue"]["ns"]


def served_on_lane(server: ServerProcess, call, model: str = "lanes") -> object:
    """``call()``'s outcome, asserting that a lane served it (one more request a lane served, one more success,
    nothing queued).  Each try waits out the quiet time (``QUIET_NS``) in which the HTTP route leaves requests to the
    core after infer requests overlapped."""
    server.wait_for_lane(model)  # the lanes follow the core's offer within a quarter second (a new worker's too)
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.02)
        before, served_before = queue_counts(server, model), server.lanes(model)[2]
        time.sleep(0.02)
        outcome = call()
        after, served_after = queue_counts(server, model), server.lanes(model)[2]
        if served_after == served_before + 1 or time.monotonic() > deadline:
            break
    assert served_after == served_before + 1, "the core served the request, not a lane"
    assert after == (before[0] + 1, before[1] + 1)
    return outcome


def a_lane_took(server: ServerProcess, call, model: str = "lanes") -> object:
    """``call()``'s outcome, asserting that a lane took it (whatever became of it: an error, a request given back
    to be finished in the core's words)."""
    server.wait_for_lane(model)
    time.sleep(0.02)  # the HTTP route's quiet time after infer requests overlapped (QUIET_NS)
    before = server.lanes(model)[2]
    outcome = call()
    assert server.lanes(model)[2] == before + 1, "no lane took the request"
    return outcome


def executing_on_lane(server: ServerProcess, call, model: str = "lanes") -> threading.Thread:
    """``call()`` started in a thread, once a lane is open, and running on it (the metrics say so)."""
    server.wait_for_lane(model)
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    server.wait_for_lane(model, executing=True)
    return thread


SMALL = np.array([[1.5, 2.0, 3.0, 4.0]], np.float32)
LARGE = np.arange(3 * 6000, dtype=np.float32).reshape(3, 6000)  # 72 KB: written into the worker's buffer


@pytest.mark.parametrize("data", [SMALL, LARGE], ids=["inline", "in the buffer"])
@pytest.mark.parametrize("outputs", [None, ["NEG", "DOUBLE"], ["SAME"]], ids=["all", "two, reversed", "its input"])
def test_a_plain_call_is_answered_on_a_lane_as_the_core_answers_it(server, data, outputs):
    on_lane = served_on_lane(server, lambda: _grpc(server, data, outputs))
    assert on_lane == _http(server, data, outputs)
    assert on_lane["id"] == "call-7" and on_lane["version"] == "1"


@pytest.mark.parametrize("first", [-1.0, -4.0, -5.0], ids=["model's error", "response parameters", "output missing"])
def test_what_a_lane_does_not_write_itself_is_answered_as_the_core_answers_it(server, first):
    data = SMALL.copy()
    data[0, 0] = first
    outputs = ["NEG"] if first == -5.0 else None
    grpc_answer = a_lane_took(server, lambda: _grpc(server, data, outputs))
    http_answer = _http(server, data, outputs)
    assert grpc_answer.pop("status", "StatusCode.INTERNAL") == "StatusCode.INTERNAL"
    assert grpc_answer == http_answer
    if first == -4.0:
        assert grpc_answer["parameters"] == {"note": "four", "n": 4}


def test_a_call_that_is_not_plain_goes_through_the_core(server):
    served_on_lane(server, lambda: _grpc(server, SMALL))  # a plain one is a lane's
    before, served = queue_counts(server), server.lanes("lanes")[2]
    assert "outputs" in _grpc(server, SMALL, parameters={"custom": "x"})
    assert queue_counts(server)[1] > before[1] + 1
    assert server.lanes("lanes")[2] == served
    wrong = _grpc(server, SMALL.astype(np.float32).reshape(1, 2, 2))  # a shape the config does not allow
    assert wrong["status"] == "StatusCode.INVALID_ARGUMENT"
    assert wrong["error"] == _http(server, SMALL.reshape(1, 2, 2))["error"]


@pytest.mark.parametrize("first, words", [(-2.0, "worker process exited with code 3; it is being restarted"),
                                          (-3.0, "execute did not finish within 2s; its worker is being restarted")],
                         ids=["worker dies", "worker hangs"])
def test_a_lost_worker_fails_the_call_in_the_cores_words_and_a_new_one_serves_the_next(server, first, words):
    data = SMALL.copy()
    data[0, 0] = first
    started = time.monotonic()
    failed = _grpc(server, data)
    assert failed == {"status": "StatusCode.INTERNAL", "error": f"model 'lanes' instance 0: {words}"}
    assert time.monotonic() - started < 8
    deadline = time.monotonic() + 30
    while "outputs" not in (answer := _grpc(server, SMALL)):
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)
    served_on_lane(server, lambda: _grpc(server, SMALL))  # the new worker's lane


def test_a_client_that_leaves_is_seen_by_the_model(server):
    data = SMALL.copy()
    data[0, 0] = -7.0
    served_on_lane(server, lambda: _grpc(server, SMALL))  # the lane is open
    before, lane_served = queue_counts(server), server.lanes("lanes")[2]
    assert _grpc(server, data, client_timeout=0.3)["status"] == "StatusCode.DEADLINE_EXCEEDED"
    deadline = time.monotonic() + 5
    while not server.mark.exists() or queue_counts(server)[0] == before[0]:
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.02)
    assert queue_counts(server) == (before[0] + 1, before[1] + 1)
    assert server.lanes("lanes")[2] == lane_served + 1  # a lane served it


def test_an_unload_waits_for_the_call_a_lane_is_serving(tmp_path):
    write_model(tmp_path / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    with ServerProcess(tmp_path / "models", "--model-control-mode", "explicit", "--load-model", "lanes",
                       env={"LANES_MARK": str(tmp_path / "mark")}) as server:
        served_on_lane(server, lambda: _grpc(server, SMALL))
        slow = SMALL.copy()
        slow[0, 0] = -6.0
        answers = []
        call = executing_on_lane(server, lambda: answers.append(_grpc(server, slow)))
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            client.unload_model("lanes")
        finally:
            client.close()
        call.join(10)
        assert answers and "outputs" in answers[0], answers
        gone = _grpc(server, SMALL)
        assert gone.get("status") in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"), gone


def _no_lane_open(server: ServerProcess, model: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.lanes(model)[0]:
        assert time.monotonic() < deadline, f"{model}'s lane is still open"
        time.sleep(0.01)


def test_tracing_sends_calls_through_the_core_while_it_is_on(server):
    served_on_lane(server, lambda: _grpc(server, SMALL))
    time.sleep(0.6)  # the descriptors counted once the lanes have settled (none retired, still closing)
    descriptors = psutil.Process(server.process.pid).num_fds()
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for _ in range(3):  # each time a lane is retired and another opened on the same worker
            client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
            _no_lane_open(server, "lanes")  # the lanes follow within a quarter second
            before, served = queue_counts(server), server.lanes("lanes")[2]
            assert "outputs" in _grpc(server, SMALL)
            assert queue_counts(server)[1] > before[1] + 1  # queued: the core served it
            assert server.lanes("lanes")[2] == served
            client.update_trace_settings(settings={"trace_level": ["OFF"]})
            served_on_lane(server, lambda: _grpc(server, SMALL))  # and a lane again once tracing is off
    finally:
        client.update_trace_settings(settings={"trace_level": ["OFF"]})
        client.close()
    time.sleep(0.8)  # the last lane retired is ended
    assert psutil.Process(server.process.pid).num_fds() <= descriptors + 2  # a client connection may linger


def test_tracing_turned_on_after_an_idle_while_reaches_the_lanes_at_once(server):
    """An idle server looks at the core's offer seldom (IDLE_RECONCILE_SECONDS); a change the core makes to it is
    followed before the call that made it is answered, not at the next look."""
    served_on_lane(server, lambda: _grpc(server, SMALL))
    time.sleep(IDLE_RECONCILE_SECONDS * 1.5)  # the looks have backed off
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert server.lanes("lanes")[0] == 0
        before = queue_counts(server)
        assert "outputs" in _grpc(server, SMALL)
        assert queue_counts(server)[1] > before[1] + 1  # queued: the core served it
    finally:
        client.update_trace_settings(settings={"trace_level": ["OFF"]})
        client.close()
    served_on_lane(server, lambda: _grpc(server, SMALL))


def test_a_model_found_sending_bls_requests_is_served_by_the_core_from_then_on(server):
    # on its lane once: its BLS request finds it out
    answer = served_on_lane(server, lambda: _grpc(server, SMALL, model="relay"), "relay")
    assert answer["outputs"][0][3] == (SMALL * 2).tolist()
    _no_lane_open(server, "relay")  # and its lane is retired at the next tick
    before, served = queue_counts(server, "relay"), server.lanes("relay")[2]
    assert _grpc(server, SMALL, model="relay")["outputs"][0][3] == (SMALL * 2).tolist()
    assert queue_counts(server, "relay")[1] > before[1] + 1
    assert server.lanes("relay")[2] == served
    time.sleep(RECONCILE_SECONDS * 3)  # the lanes' ticks that would open it again, had it not been found out
    assert server.lanes("relay")[0] == 0


def test_sigterm_past_the_drain_counts_a_lanes_call_as_cut_off(tmp_path):
    """A call a lane serves is not one the core's drain can see: the server still exits with the cut-off code."""
    write_model(tmp_path / "models", "lanes", CONFIG, {"1/model.py": MODEL})
    server = ServerProcess(tmp_path / "models", "--shutdown-timeout", "0.3",
                           env={"LANES_MARK": str(tmp_path / "mark")}).start()
    try:
        served_on_lane(server, lambda: _grpc(server, SMALL))
        slow = SMALL.copy()
        slow[0, 0] = -6.0  # takes a second
        call = executing_on_lane(server, lambda: _grpc(server, slow))
        assert server.stop() == EXIT_CUT_OFF, server.log()
        call.join(10)
    finally:
        server.stop()


def _lane_buffer_bytes(pid: int) -> int:
    """The bytes of shared memory the server's lane buffers hold: the pages of the memfds its lanes map, whichever
    process wrote them."""
    blocks: dict[int, int] = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "triton-direct" in fields[5]:
                found = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
                blocks[found.st_ino] = found.st_blocks
    return sum(blocks.values()) * 512


def test_a_lanes_buffer_written_by_a_large_call_goes_back_once_idle(server):
    """The pages a large input wrote into the lane's buffer (shared memory outside the tensor pool's bound) are
    given back after a second without calls, and the lane serves on."""
    large = np.ones((1, 6 << 20), np.float32)  # 24 MiB
    served_on_lane(server, lambda: _grpc(server, SMALL))  # the lane is open
    time.sleep(1.5)  # and has given back what it held
    before = _lane_buffer_bytes(server.process.pid)
    held = []

    def call() -> dict:
        # held as the answer arrives: decoding a 24 MiB answer into lists here can outlast the second after which
        # the lane gives its pages back (on a slow VM it did, twice in a row)
        return _grpc(server, large, ["NEG"], answered=lambda: held.append(_lane_buffer_bytes(server.process.pid)))

    answer = served_on_lane(server, call)
    assert answer["outputs"][0][3][0][:2] == [-1.0, -1.0]
    assert max(held) - before > 20 << 20  # written
    deadline = time.monotonic() + 5
    while _lane_buffer_bytes(server.process.pid) - before > 4 << 20:
        assert time.monotonic() < deadline, "the lane's buffer was never given back"
        time.sleep(0.1)
    served_on_lane(server, lambda: _grpc(server, LARGE))  # written again, served on the lane as before
