"""Python-backend workers: restarts with backoff, honest model state while down, dead idle workers replaced."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""
# initialize fails while the flag file exists; IN == -1 crashes the worker
MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

FLAG = {flag!r}


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(FLAG):
            raise RuntimeError("the GPU is gone")

    def execute(self, requests):
        value = float(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0])
        if value == -1:
            os._exit(7)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()),
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        ]) for r in requests]
"""


READINESS_FAMILIES = ("serverless_triton_model_ready", "serverless_triton_instances_unavailable",
                      "serverless_triton_worker_restarts_total")


@pytest.fixture
def flaky(tmp_path):
    flag = tmp_path / "fail-initialize"
    write_model(tmp_path / "models", "flaky", CONFIG, {"1/model.py": MODEL.format(flag=str(flag))})
    process = ServerProcess(tmp_path / "models", "--model-control-mode", "explicit", "--load-model", "flaky").start()
    yield process, flag
    assert process.stop() == 0, process.log()


def _infer(url: str, value: float):
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
    return client.infer("flaky", [tensor])


def _wait(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _index(url: str) -> list[dict]:
    return httpx.post(f"http://{url}/v2/repository/index").json()


def test_a_failing_restart_is_retried_and_visible_until_it_succeeds(flaky):
    process, flag = flaky
    url = process.http_url
    assert _infer(url, 1.0).as_numpy("OUT").tolist() == [1.0]
    flag.write_text("x")
    with pytest.raises(InferenceServerException) as crashed:
        _infer(url, -1.0)
    assert "exited with code 7" in crashed.value.message()

    # While the worker cannot come back, the model says so: not ready, UNAVAILABLE with the reason, 503.
    _wait(lambda: "restart attempt 2 failed" in (_index(url)[0].get("reason") or ""))
    row = _index(url)[0]
    assert row["state"] == "UNAVAILABLE"
    assert "exited with code 7" in row["reason"] and "the GPU is gone" in row["reason"]
    assert httpx.get(f"http://{url}/v2/models/flaky/ready").status_code == 400
    assert _readiness_metrics(process, "flaky") == {"serverless_triton_model_ready": 0.0,
                                                     "serverless_triton_instances_unavailable": 1.0,
                                                     "serverless_triton_worker_restarts_total": 1.0}
    with pytest.raises(InferenceServerException) as down:
        _infer(url, 2.0)
    assert down.value.status() == "503"
    assert "the GPU is gone" in down.value.message()

    # Once initialize can succeed again, the backoff brings the worker back without anyone's help.
    flag.unlink()
    _wait(lambda: httpx.get(f"http://{url}/v2/models/flaky/ready").status_code == 200, timeout=40)
    assert _infer(url, 3.0).as_numpy("OUT").tolist() == [3.0]
    assert _index(url)[0]["state"] == "READY"
    assert "worker restarted (attempt" in process.log()
    assert _readiness_metrics(process, "flaky") == {"serverless_triton_model_ready": 1.0,
                                                     "serverless_triton_instances_unavailable": 0.0,
                                                     "serverless_triton_worker_restarts_total": 1.0}


def _readiness_metrics(process: ServerProcess, model: str) -> dict[str, float]:
    """The readiness families' values for ``model``'s version 1, from /metrics."""
    found = {}
    for line in httpx.get(f"http://127.0.0.1:{process.metrics_port}/metrics", timeout=10).text.splitlines():
        name, _, rest = line.partition("{")
        if name in READINESS_FAMILIES and f'model="{model}"' in rest:
            found[name] = float(rest.rsplit(" ", 1)[1])
    return found


def test_readiness_while_one_of_two_workers_restarts(tmp_path):
    """One instance's worker down: the model stays ready (the other serves) and so does the strict server; both
    down: neither is, until a worker is back."""
    flag = tmp_path / "fail-initialize"
    config = CONFIG + "instance_group [ { kind: KIND_CPU count: 2 } ]\n"
    write_model(tmp_path / "models", "flaky", config, {"1/model.py": MODEL.format(flag=str(flag))})
    with ServerProcess(tmp_path / "models", strict=True) as process:
        url = process.http_url
        flag.write_text("x")  # no worker comes back while it is there
        with pytest.raises(InferenceServerException):
            _infer(url, -1.0)
        _wait(lambda: _readiness_metrics(process, "flaky")["serverless_triton_instances_unavailable"] == 1.0)
        assert httpx.get(f"http://{url}/v2/models/flaky/ready").status_code == 200
        assert httpx.get(f"http://{url}/v2/health/ready").status_code == 200
        assert _infer(url, 2.0).as_numpy("OUT").tolist() == [2.0]  # the other instance serves
        assert _readiness_metrics(process, "flaky")["serverless_triton_model_ready"] == 1.0
        with pytest.raises(InferenceServerException):
            _infer(url, -1.0)  # the other one goes down too
        _wait(lambda: _readiness_metrics(process, "flaky")["serverless_triton_instances_unavailable"] == 2.0)
        assert httpx.get(f"http://{url}/v2/models/flaky/ready").status_code == 400
        assert httpx.get(f"http://{url}/v2/health/ready").status_code == 400
        assert _readiness_metrics(process, "flaky") == {"serverless_triton_model_ready": 0.0,
                                                         "serverless_triton_instances_unavailable": 2.0,
                                                         "serverless_triton_worker_restarts_total": 2.0}
        flag.unlink()
        _wait(lambda: httpx.get(f"http://{url}/v2/health/ready").status_code == 200, timeout=40)
        assert httpx.get(f"http://{url}/v2/models/flaky/ready").status_code == 200


def test_a_worker_killed_while_idle_is_replaced_before_the_next_request(flaky):
    process, _ = flaky
    pid = int(_infer(process.http_url, 1.0).as_numpy("PID")[0])
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    result = _infer(process.http_url, 2.0)  # no failure: the dead worker is noticed before dispatch
    assert result.as_numpy("OUT").tolist() == [2.0]
    assert int(result.as_numpy("PID")[0]) != pid
    assert "killed by signal 9 while idle" in process.log()


def test_unloading_a_model_that_never_loaded_is_immediate(flaky):
    process, flag = flaky
    assert httpx.post(f"http://{process.http_url}/v2/repository/models/flaky/unload").status_code == 200
    flag.write_text("x")
    response = httpx.post(f"http://{process.http_url}/v2/repository/models/flaky/load")
    assert response.status_code == 400 and "the GPU is gone" in response.text
    started = time.monotonic()
    response = httpx.post(f"http://{process.http_url}/v2/repository/models/flaky/unload", timeout=60)
    assert response.status_code == 200
    assert time.monotonic() - started < 2.0
    assert "did not finish" not in process.log()


HOARDER = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        self.kept.append(np.ones(50 << 18, np.float32))  # keeps 50 MB per call, never lets go
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()),
            pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        ]) for r in requests]
"""


def test_a_worker_past_its_memory_limit_is_replaced(tmp_path):
    """A model that keeps 50 MB per call grew its worker without limit; with worker_max_memory_bytes set, the worker
    is replaced once past it, between requests, and every request is answered."""
    limit = 200 << 20
    write_model(tmp_path / "models", "hoarder", CONFIG + 'parameters { key: "worker_max_memory_bytes" value { '
                f'string_value: "{limit}" }} }}\n', {"1/model.py": HOARDER})
    with ServerProcess(tmp_path / "models") as server:
        pids = set()
        client = httpclient.InferenceServerClient(server.http_url)
        for call in range(10):
            tensor = httpclient.InferInput("IN", [1], "FP32")
            tensor.set_data_from_numpy(np.array([call], dtype=np.float32))
            result = client.infer("hoarder", [tensor])
            assert result.as_numpy("OUT")[0] == call
            pids.add(int(result.as_numpy("PID")[0]))
            time.sleep(1.2)  # the watch looks once a second
        assert len(pids) > 1  # replaced at least once, not grown to 500 MB
        assert "past worker_max_memory_bytes" in server.log()
