"""Sequence batching as tritonclient users drive it: a stateful Python model over HTTP, gRPC and gRPC
streams, numeric and string correlation IDs, control inputs for ONNX, interleaved sequences that never share
state, idle sequences released, and more sequences than slots waiting for one to end."""

from __future__ import annotations

import json
import queue
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import save_onnx
from tests.support import ServerProcess, write_model

# OUTPUT: the running sum of INPUT over the sequence; FLAGS: what the model saw of the sequence.
ACCUMULATE = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            ready = int(pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().reshape(-1)[0])
            end = int(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0])
            key = request.correlation_id()
            total = (0 if start else self.sums.get(key, 0)) + value
            self.sums[key] = total
            if end:
                del self.sums[key]
            seen = json.dumps([key, request.flags(), start, ready, end, json.loads(request.parameters())])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32)),
                pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=object))]))
        return responses
"""
SEQUENCE_CONFIG = """
backend: "python"
max_batch_size: 2
sequence_batching {
  max_sequence_idle_microseconds: %d
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
ONNX_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
# One slot, a UINT64 CORRID control echoed back.
CORRID64_CONFIG = """
backend: "python"
max_batch_size: 1
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_UINT64 dims: [ 1 ] } ]
"""
ECHO_CORRID = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT",
                                                            pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy())])
                for r in requests]
"""


def build_control_onnx(path) -> None:
    """OUTPUT = INPUT + 100 * START + 1000 * CORRID: what the server fed the model, visible in the answer."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Mul", ["START", "hundred"], ["s"]),
             helper.make_node("Mul", ["CORRID", "thousand"], ["c"]),
             helper.make_node("Add", ["INPUT", "s"], ["t"]), helper.make_node("Add", ["t", "c"], ["OUTPUT"])]
    graph = helper.make_graph(
        nodes, "controls",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 1]) for name in ("INPUT", "START", "CORRID")],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array(100, np.float32), "hundred"),
         numpy_helper.from_array(np.array(1000, np.float32), "thousand")])
    save_onnx(graph, path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequences") / "models"
    write_model(root, "accumulate", SEQUENCE_CONFIG % 30_000_000, {"1/model.py": ACCUMULATE})
    write_model(root, "forgetful", SEQUENCE_CONFIG % 300_000, {"1/model.py": ACCUMULATE})  # idle after 0.3 s
    build_control_onnx(root / "controls" / "1" / "model.onnx")
    write_model(root, "controls", ONNX_CONFIG)
    write_model(root, "corrid64", CORRID64_CONFIG, {"1/model.py": ECHO_CORRID})
    with ServerProcess(root) as process:
        process.wait_loaded()
        yield process


def _send(client, module, model: str, value: int, sequence_id, start=False, end=False) -> tuple[int, list]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    seen = result.as_numpy("SEEN")[0][0]
    return int(result.as_numpy("OUTPUT")[0][0]), json.loads(seen.decode() if isinstance(seen, bytes) else seen)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_keeps_its_state_and_sees_its_flags(served, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    ident = 41 if protocol == "http" else "order-42"  # numeric and string correlation IDs
    total, seen = _send(client, module, "accumulate", 5, ident, start=True)
    assert total == 5 and seen == [ident, 1, 1, 1, 0, {}]  # START flag, controls; no sequence_* parameters
    assert _send(client, module, "accumulate", 7, ident)[0] == 12
    total, seen = _send(client, module, "accumulate", 1, ident, end=True)
    assert total == 13 and seen[1:5] == [2, 0, 1, 1]  # END flag and control
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, module, "accumulate", 1, ident)  # ended: a new request must start again


def test_bad_sequence_requests_get_tritons_words(served):
    client = httpclient.InferenceServerClient(served.http_url)
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        client.infer("accumulate", [tensor])
    with pytest.raises(InferenceServerException, match="must specify the START flag on the first request"):
        client.infer("accumulate", [tensor], sequence_id=999)
    pair = httpclient.InferInput("INPUT", [2, 1], "INT32")
    pair.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1"):
        client.infer("accumulate", [pair], sequence_id=3, sequence_start=True)


def test_a_sequence_id_past_64_bits_is_refused_and_keeps_no_slot(served):
    """2**64 once made the UINT64 CORRID control overflow: a 500, after the sequence took the model's one slot."""
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
            "parameters": {"sequence_id": 2**64, "sequence_start": True, "sequence_end": True}}
    for _ in range(2):
        response = httpx.post(f"http://{served.http_url}/v2/models/corrid64/infer", json=body, timeout=10)
        assert response.status_code == 400 and "'sequence_id'" in response.json()["error"], response.text
    client = httpclient.InferenceServerClient(served.http_url, network_timeout=5)
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    largest = 2**64 - 1
    result = client.infer("corrid64", [tensor], sequence_id=largest, sequence_start=True, sequence_end=True)
    assert int(result.as_numpy("OUTPUT")[0][0]) == largest  # the one slot was free, and the largest ID fits


def test_interleaved_sequences_never_share_state(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    ids = list(range(100, 120))
    expected = dict.fromkeys(ids, 0)
    errors: list[str] = []

    def run(ident: int) -> None:
        own = grpcclient.InferenceServerClient(served.grpc_url)
        try:
            for step in range(5):
                value = ident * 10 + step
                expected[ident] += value
                total, seen = _send(own, grpcclient, "accumulate", value, ident, start=step == 0, end=step == 4)
                if total != expected[ident] or seen[0] != ident:
                    errors.append(f"sequence {ident} step {step}: {total} != {expected[ident]}")
        except InferenceServerException as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=run, args=(ident,)) for ident in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []  # two slots, twenty sequences: the others waited for a slot, none saw another's sums
    assert client.is_server_live()


def test_new_sequences_wait_for_a_slot_within_bounds(tmp_path):
    """One client holding every slot (never sending END) locked every new sequence out without an answer; now
    a new sequence waits at most server.sequence_slot_timeout_seconds (or its request's timeout), behind at most
    the queue size of others, then gets UNAVAILABLE."""
    root = tmp_path / "models"
    write_model(root, "accumulate", SEQUENCE_CONFIG % 30_000_000, {"1/model.py": ACCUMULATE})
    config = tmp_path / "function.yaml"
    config.write_text("server:\n  sequence_slot_timeout_seconds: 1\n  default_max_queue_size: 3\n")
    with ServerProcess(root, "--config", str(config)) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
        for held in (1001, 1002):  # both slots of the one instance, never ended
            _send(client, httpclient, "accumulate", 1, held, start=True)
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="no sequence slot of model 'accumulate' became free "
                                                           "within 1 s") as waited:
            _send(client, httpclient, "accumulate", 1, 1003, start=True)
        assert 0.9 < time.monotonic() - started < 5 and waited.value.status() == "503"
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1]], np.int32))
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="within 0.2 s"):
            client.infer("accumulate", [tensor], sequence_id=1004, sequence_start=True, timeout=200_000)
        assert time.monotonic() - started < 0.9

        outcomes: list[str] = []

        def wait_for_slot(ident: int) -> None:
            own = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
            try:
                _send(own, httpclient, "accumulate", 1, ident, start=True)
                outcomes.append("served")
            except InferenceServerException as exc:
                outcomes.append(str(exc))
            finally:
                own.close()  # in the thread that made it: gevent's pool cannot be joined from another thread

        waiters = [threading.Thread(target=wait_for_slot, args=(2000 + index,)) for index in range(3)]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match=r"Exceeds maximum queue size \(3\)"):
            _send(client, httpclient, "accumulate", 1, 3000, start=True)  # a fourth waiter: refused at once
        assert time.monotonic() - started < 0.5
        for waiter in waiters:
            waiter.join(10)
        assert len(outcomes) == 3 and all("became free within 1 s" in outcome for outcome in outcomes), outcomes
        for held in (1001, 1002):
            _send(client, httpclient, "accumulate", 1, held, end=True)
        assert _send(client, httpclient, "accumulate", 5, 1005, start=True, end=True)[0] == 5  # slots free again


def test_sequences_over_a_grpc_stream(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for step, value in enumerate((3, 4, 5)):
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], np.int32))
        client.async_stream_infer("accumulate", [tensor], sequence_id=77, sequence_start=step == 0,
                                  sequence_end=step == 2)
    totals = []
    for _ in range(3):
        result, error = answers.get(timeout=30)
        assert error is None, error
        totals.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    assert totals == [3, 7, 12]


def test_an_idle_sequence_is_released(served):
    client = httpclient.InferenceServerClient(served.http_url)
    assert _send(client, httpclient, "forgetful", 2, 5, start=True)[0] == 2
    time.sleep(1.0)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, httpclient, "forgetful", 2, 5)


def test_control_inputs_reach_an_onnx_model(served):
    client = httpclient.InferenceServerClient(served.http_url)
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    first = client.infer("controls", [tensor], sequence_id=3, sequence_start=True).as_numpy("OUTPUT")
    then = client.infer("controls", [tensor], sequence_id=3, sequence_end=True).as_numpy("OUTPUT")
    assert first.tolist() == [[3101.0]] and then.tolist() == [[3001.0]]


STATEFUL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            total = value + pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total),
                                                         pb_utils.Tensor("STATE_OUT", total)]))
        return responses
"""
STATE_CONFIG = """
%s
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def build_state_onnx(path) -> None:
    """Triton's simple_sequence accumulator as an ONNX graph: OUTPUT = STATE_OUT = (INPUT + STATE_IN * (1 - START))
    * READY, with START and READY control inputs and the running sum kept in implicit state."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Sub", ["one", "START"], ["carry"]),
             helper.make_node("Mul", ["STATE_IN", "carry"], ["kept"]),
             helper.make_node("Add", ["INPUT", "kept"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])]
    graph = helper.make_graph(
        nodes, "state", [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
                         for n in ("INPUT", "STATE_IN", "START", "READY")],
        [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1]) for n in ("OUTPUT", "STATE_OUT")],
        [numpy_helper.from_array(np.array(1, np.int32), "one")])
    save_onnx(graph, path)


@pytest.mark.parametrize("backend", ["python", "onnx"])
def test_implicit_state_is_carried_per_sequence_and_reset_at_start(tmp_path, backend):
    root = tmp_path / "models"
    if backend == "python":
        write_model(root, "stateful", STATE_CONFIG % 'backend: "python"', {"1/model.py": STATEFUL})
    else:
        build_state_onnx(root / "stateful" / "1" / "model.onnx")
        write_model(root, "stateful", STATE_CONFIG % 'platform: "onnxruntime_onnx"')
    with ServerProcess(root) as process:
        client = httpclient.InferenceServerClient(process.http_url)

        def send(value: int, ident: int, start: bool = False, end: bool = False) -> int:
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            result = client.infer("stateful", [tensor], sequence_id=ident, sequence_start=start, sequence_end=end)
            assert result.as_numpy("STATE_OUT") is None  # the state never reaches the client
            return int(result.as_numpy("OUTPUT")[0][0])

        assert [send(1, 1, start=True), send(100, 2, start=True)] == [1, 100]
        assert [send(2, 1), send(200, 2), send(3, 1)] == [3, 300, 6]  # interleaved, never mixed
        assert send(5, 1, start=True) == 5  # START resets the state
        assert send(1, 2, end=True) == 301
        with pytest.raises(InferenceServerException, match="unexpected inference output 'STATE_OUT'"):
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[1]], np.int32))
            client.infer("stateful", [tensor], sequence_id=1,
                         outputs=[httpclient.InferRequestedOutput("STATE_OUT")])


def test_the_sequence_batchers_own_queue_delay_and_preferred_sizes_drive_its_batching():
    from concurrent.futures import ThreadPoolExecutor

    from runtime.config.pbtxt import parse_model_config
    from runtime.scheduling.scheduler import Scheduler
    from runtime.scheduling.stats import ModelStatistics

    base = """backend: "python"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    oldest = parse_model_config(base + """sequence_batching { oldest { max_candidate_sequences: 4
        preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 5000 } }""", "m")
    direct = parse_model_config(base + "sequence_batching { direct { max_queue_delay_microseconds: 700 } }", "m")
    assert (oldest.sequence.max_candidates, oldest.sequence.preferred_batch_sizes,
            oldest.sequence.max_queue_delay_seconds) == (4, (2, 4), 0.005)
    assert (direct.sequence.preferred_batch_sizes, direct.sequence.max_queue_delay_seconds) == ((), 0.0007)
    with ThreadPoolExecutor(1) as executor:
        scheduler = Scheduler(oldest, [], executor, ModelStatistics(), batch_always=True,
                              max_delay=oldest.sequence.max_queue_delay_seconds,
                              preferred_sizes=oldest.sequence.preferred_batch_sizes)
        forming = scheduler.forming
        assert (forming.max_batch, forming.target_batch, forming.max_delay) == (8, 4, 0.005)


@pytest.mark.parametrize("ident, datatype, expected", [
    # what Triton 2.51 fed a Python model's UINT64 CORRID control for these string IDs (seen from the oracle)
    ("abc", "UINT64", 27974191445704707),
    ("abcdefghij", "UINT64", 7233733595238498314),
    ("a", "UINT64", 416611827713),
    ("abc", "INT32", 3),  # the length prefix is all that fits
    (12, "UINT64", 12),
    ("order-42", "BYTES", "order-42"),
])
def test_a_string_id_in_a_numeric_corrid_control_reads_as_tritons(ident, datatype, expected):
    from runtime.scheduling.sequence import corrid_value

    assert corrid_value(ident, datatype) == expected
