"""Python-backend batches sent from the event loop (small inputs) and from a thread (large ones) answer alike."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient

from handlers.python.batch import ON_LOOP_INPUT_BYTES
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
