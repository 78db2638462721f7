"""Python-backend batches sent from the event loop (small inputs) and from a thread (large ones) answer alike."""

from __future__ import annotations

import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from handlers.python.batch import ON_LOOP_INPUT_BYTES
from runtime.scheduling.batch_forming import SEPARATE_EXECUTIONS
from tests.support import ServerProcess, python_model_source, write_model

DOUBLE = python_model_source("""
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
        for r in requests]
""")
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def test_small_and_large_inputs_interleaved_answer_exactly(tmp_path):
    write_model(tmp_path / "models", "double", CONFIG, {"1/model.py": DOUBLE})
    process = ServerProcess(tmp_path / "models").start()
    try:
        sizes = [4, 1000, ON_LOOP_INPUT_BYTES // 4 - 1, ON_LOOP_INPUT_BYTES // 4 + 1, 3 * ON_LOOP_INPUT_BYTES // 4]

        def call(index: int) -> bool:
            client = grpcclient.InferenceServerClient(process.grpc_url)
            data = np.arange(sizes[index % len(sizes)], dtype=np.float32) + index
            tensor = grpcclient.InferInput("IN", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            return np.array_equal(client.infer("double", [tensor]).as_numpy("OUT"), data * 2)

        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(call, range(60)))
        stats = grpcclient.InferenceServerClient(process.grpc_url).get_inference_statistics("double", as_json=True)
        assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) == 60
    finally:
        assert process.stop() == 0, process.log()


ALONE = python_model_source("""
if len(requests) != 1:  # without dynamic batching Triton gives execute one request
    raise pb_utils.TritonModelException(f"{len(requests)} requests in one execute")
data = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
if data.min() < 0:
    raise ValueError("a negative input")
time.sleep(0.0005)
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)])]
""")
ALONE_CONFIG = CONFIG.replace("max_batch_size: 0", "max_batch_size: 8").replace("dims: [ -1 ]", "dims: [ 3 ]")


def _doubled(url: str, model: str, value: float) -> str:
    """"right" where ``model`` answers ``value`` (three of it) doubled, else its error's message."""
    data = np.full((1, 3), value, dtype=np.float32)
    tensor = grpcclient.InferInput("IN", [1, 3], "FP32")
    tensor.set_data_from_numpy(data)
    try:
        answer = grpcclient.InferenceServerClient(url).infer(model, [tensor], client_timeout=60).as_numpy("OUT")
    except InferenceServerException as exc:
        return exc.message()
    return "right" if np.array_equal(answer, data * 2) else "wrong"


def test_requests_queued_for_a_model_without_dynamic_batching_execute_each_alone(tmp_path):
    # queued requests reach the worker together (batch_forming.py, SEPARATE_EXECUTIONS); each still gets an execute of
    # its own, its own answer and its own error, and the statistics count each execution
    write_model(tmp_path / "models", "alone", ALONE_CONFIG, {"1/model.py": ALONE})
    process = ServerProcess(tmp_path / "models").start()
    try:
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda i: _doubled(process.grpc_url, "alone", -1.0 if i % 7 == 3 else i),
                                     range(400)))
        assert all(("a negative input" in outcome) if index % 7 == 3 else outcome == "right"
                   for index, outcome in enumerate(outcomes)), outcomes
        stats = grpcclient.InferenceServerClient(process.grpc_url).get_inference_statistics("alone", as_json=True)
        model = stats["model_stats"][0]
        assert int(model["execution_count"]) == 400
        assert int(model["inference_stats"]["success"]["count"]) == 400 - len(range(3, 400, 7))
    finally:
        assert process.stop() == 0, process.log()


def test_a_worker_lost_with_requests_handed_over_together_fails_them_plainly_and_recovers(tmp_path):
    # the one that kills the worker fails, and so do those handed over with it that it had already executed (the
    # worker answers them together), naming what happened; the rest are served, and so is what comes after
    body = textwrap.dedent(ALONE).replace('raise ValueError("a negative input")', "os._exit(3)")
    write_model(tmp_path / "models", "fragile", ALONE_CONFIG, {"1/model.py": body})
    process = ServerProcess(tmp_path / "models").start()
    try:
        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(lambda i: _doubled(process.grpc_url, "fragile", -1.0 if i == 150 else i),
                                     range(300)))
        # while the worker restarts the model is unready, and what arrives then is refused at once, as in Triton
        refused = [outcome for outcome in outcomes if "has no available versions" in outcome]
        failed = [outcome for outcome in outcomes if outcome != "right" and outcome not in refused]
        assert "exited with code 3" in outcomes[150] and "restarted" in outcomes[150]
        assert 1 <= len(failed) <= SEPARATE_EXECUTIONS  # those handed over with it, at most
        assert all("exited with code 3" in outcome and "restarted" in outcome for outcome in failed), failed
        assert _doubled(process.grpc_url, "fragile", 7.0) == "right"
    finally:
        assert process.stop() == 0, process.log()
