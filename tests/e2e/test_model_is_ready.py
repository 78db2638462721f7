"""A Python model's own ``is_ready`` (python_backend 2.67, #430), ported from Triton's
qa/L0_backend_python/model_readiness: true, false, raising, not a bool, past the 5 s bound (a probe meanwhile takes
the running check's answer), ``async def``, a decoupled model; asked over HTTP and gRPC while inference goes on,
and while a long ``execute`` runs; the server's readiness asks it too under strict readiness (Triton 2.68)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import ServerProcess, write_model

# qa's readiness_model.py, and its coroutine twin
READINESS_MODEL = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.value = params.get("READINESS_FN_RETURN_VALUE", {}).get("string_value", "true")
        self.delay = float(params.get("READINESS_FN_DELAY_SECS", {}).get("string_value", "0"))

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data[0] == 42:  # a long execute: is_ready is still answered meanwhile
                time.sleep(3)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses

    def is_ready(self):
        if self.delay > 0:
            time.sleep(self.delay)
        if self.value == "false":
            return False
        if self.value == "exception":
            raise RuntimeError("Internal check failed - model is not ready")
        if self.value == "non_boolean":
            return "ready"
        return True
"""
COROUTINE_MODEL = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]

    async def is_ready(self):
        await asyncio.sleep(0.1)
        return True
"""
DECOUPLED_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def is_ready(self):
        return True
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
MODES = {"two ports": (), "one port": ("--single-port",)}


def _with(value: str, delay: str) -> str:
    return CONFIG + (f'parameters {{ key: "READINESS_FN_RETURN_VALUE" value: {{ string_value: "{value}" }} }}\n'
                     f'parameters {{ key: "READINESS_FN_DELAY_SECS" value: {{ string_value: "{delay}" }} }}\n')


def _repository(root) -> object:
    repository = root / "models"
    for name, value, delay in (("is_ready_fn_returns_true", "true", "0.1"),
                               ("is_ready_fn_returns_false", "false", "0.1"),
                               ("is_ready_fn_raises_error", "exception", "0.1"),
                               ("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
                               ("is_ready_fn_timeout", "true", "6")):
        write_model(repository, name, _with(value, delay), {"1/model.py": READINESS_MODEL})
    write_model(repository, "is_ready_fn_coroutine_returns_true", CONFIG, {"1/model.py": COROUTINE_MODEL})
    write_model(repository, "is_ready_fn_returns_true_decoupled",
                CONFIG + "model_transaction_policy { decoupled: true }\n", {"1/model.py": DECOUPLED_MODEL})
    write_model(repository, "no_is_ready", CONFIG, {"1/model.py": READINESS_MODEL.replace("def is_ready", "def other")})
    return repository


@pytest.fixture(scope="module", params=list(MODES))
def served(request, tmp_path_factory):
    """As Triton's test: every model loaded, --strict-readiness=false."""
    with ServerProcess(_repository(tmp_path_factory.mktemp("is-ready")), *MODES[request.param]) as server:
        grpc_url = server.http_url if request.param == "one port" else server.grpc_url
        yield server, grpc_url


def _clients(served):
    server, grpc_url = served
    return httpclient.InferenceServerClient(server.http_url), grpcclient.InferenceServerClient(grpc_url)


def _infer(client, module, model: str, value: float = 1.0) -> None:
    inputs = [module.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([value], dtype=np.float32))
    assert client.infer(model, inputs).as_numpy("OUTPUT0")[0] == value


@pytest.mark.parametrize("model, ready", [
    ("is_ready_fn_returns_true", True), ("is_ready_fn_returns_false", False), ("is_ready_fn_raises_error", False),
    ("is_ready_fn_returns_non_boolean", False), ("is_ready_fn_coroutine_returns_true", True), ("no_is_ready", True),
])
def test_each_answer(served, model, ready):
    http, grpc_client = _clients(served)
    for _ in range(3):
        assert http.is_model_ready(model) is ready
        assert grpc_client.is_model_ready(model) is ready
        _infer(http, httpclient, model)  # inference is not affected by the check
        _infer(grpc_client, grpcclient, model)
    assert http.is_server_ready()  # not strict: the server stays ready


def test_past_the_bound_then_the_running_check_s_answer(served):
    """qa's ``test_is_ready_takes_long_time``: the probe past 5 s answers not ready; the next probe starts no
    second check but takes the running one's answer once it comes (6 s in)."""
    http, grpc_client = _clients(served)
    for _ in range(2):
        started = time.monotonic()
        assert http.is_model_ready("is_ready_fn_timeout") is False
        assert 4.5 < time.monotonic() - started < 6.0
        _infer(http, httpclient, "is_ready_fn_timeout")
        assert grpc_client.is_model_ready("is_ready_fn_timeout") is True
        assert time.monotonic() - started < 7.5


def test_answered_while_execute_runs(served):
    http, _ = _clients(served)
    busy = threading.Thread(target=_infer, args=(httpclient.InferenceServerClient(served[0].http_url), httpclient,
                                                 "is_ready_fn_returns_true", 42.0))
    busy.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert http.is_model_ready("is_ready_fn_returns_true") is True
    assert time.monotonic() - started < 2.0  # not after the 3 s execute
    busy.join()


@pytest.mark.parametrize("model", ["is_ready_fn_returns_true", "is_ready_fn_returns_true_decoupled"])
def test_concurrent_ready_and_infer(served, model):
    """qa's ``test_multiple_concurrent_ready_and_infer_requests`` (and its decoupled twin), 16 of each."""
    server, grpc_url = served

    def ready(index: int) -> bool:
        if index % 2:
            with grpcclient.InferenceServerClient(grpc_url) as client:
                return client.is_model_ready(model)
        with httpclient.InferenceServerClient(server.http_url) as client:
            return client.is_model_ready(model)

    def infer(index: int) -> bool:
        with grpcclient.InferenceServerClient(grpc_url) as client:
            inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([index], dtype=np.float32))
            answers: list = []
            done = threading.Event()
            client.start_stream(lambda result, error: (answers.append(error or result), done.set()))
            client.async_stream_infer(model, inputs)
            done.wait(30)
            client.stop_stream()
            return answers[0].as_numpy("OUTPUT0")[0] == index

    with ThreadPoolExecutor(32) as pool:
        readies = [pool.submit(ready, index) for index in range(16)]
        infers = [pool.submit(infer, index) for index in range(16)]
        assert all(future.result(60) for future in readies)
        assert all(future.result(60) for future in infers)


def test_strict_server_readiness_asks_every_model(tmp_path):
    """Triton 2.68: under strict readiness, /v2/health/ready is false while a model's is_ready says no."""
    repository = tmp_path / "models"
    write_model(repository, "fine", _with("true", "0"), {"1/model.py": READINESS_MODEL})
    write_model(repository, "says_no", _with("true", "0"), {"1/model.py": READINESS_MODEL})
    flag = repository / "says_no" / "not-ready"
    (repository / "says_no" / "1" / "model.py").write_text(READINESS_MODEL.replace(
        "        if self.value == \"false\":",
        f"        if __import__('os').path.exists({str(flag)!r}):\n            return False\n"
        "        if self.value == \"false\":"))
    with ServerProcess(repository, strict=True) as server:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        assert http.is_server_ready() and grpc_client.is_server_ready()
        flag.touch()
        assert not http.is_server_ready() and not grpc_client.is_server_ready()
        assert http.is_model_ready("fine") and not http.is_model_ready("says_no")
        flag.unlink()
        assert http.is_server_ready() and grpc_client.is_server_ready()
