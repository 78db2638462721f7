"""The native libraries' environment, set by the composition root, reaches the server and the Python workers:
onnxruntime's telemetry stays off (handlers/onnx/environment.py: its 1DS client, on by default since 1.32, writes
under ``~/.cache/Microsoft`` at the first session and then queries DNS every few seconds for good), and OpenBLAS's
idle threads sleep instead of spinning (runtime/openblas_threads.py)."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, write_add_sub_onnx, write_model

SESSION_IN_WORKER = """
import os

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], "..", "simple", "1", "model.onnx")
        self.session = ort.InferenceSession(path)  # where its telemetry would start
        self.quiet = os.environ.get("ORT_DISABLE_TELEMETRY") == "1" and os.environ.get("OPENBLAS_THREAD_TIMEOUT") == "4"

    def execute(self, requests):
        value = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * float(self.quiet))])]
"""


def test_onnxruntime_writes_nothing_home_in_the_server_or_its_workers(tmp_path):
    repository = tmp_path / "models"
    write_add_sub_onnx(repository, "simple")
    write_model(repository, "session_in_worker", IDENTITY_PYTHON_CONFIG, {"1/model.py": SESSION_IN_WORKER})
    home, cache = tmp_path / "home", tmp_path / "xdg-cache"
    home.mkdir()
    environment = {"HOME": str(home), "XDG_CACHE_HOME": str(cache)}
    with ServerProcess(repository, env=environment, strict=True) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.5, 2.0], dtype=np.float32))
        np.testing.assert_array_equal(client.infer("session_in_worker", [tensor]).as_numpy("OUT"), [1.5, 2.0])
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones([1, 16], dtype=np.int32))
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), np.full([1, 16], 2))
        client.close()
    assert not (home / ".cache" / "Microsoft").exists()
    assert not (cache / "Microsoft").exists()
