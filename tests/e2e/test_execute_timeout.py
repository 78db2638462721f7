"""A hung execution is bounded by server.execute_timeout_seconds (60 s by default): its requests are answered at the
timeout, a Python worker is recycled, and an instance that cannot be (a model running in a server thread) keeps the
model unready until it returns.  A model that never returned once wedged its instance for 600 s while reporting
ready."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model

# IN < 0: hang for 5 s (far past the 1 s execute timeout), else answer at once.
HANGS = python_model_source("""
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    if (data < 0).any():
        time.sleep(5)
    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
return responses
""")
IN_THREAD = 'parameters { key: "isolation" value { string_value: "thread" } }\n'


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("execute_timeout")
    write_model(folder / "models", "hangs_in_worker", IDENTITY_PYTHON_CONFIG, {"1/model.py": HANGS})
    write_model(folder / "models", "hangs_in_thread", IDENTITY_PYTHON_CONFIG + IN_THREAD, {"1/model.py": HANGS})
    config = folder / "function.yaml"
    config.write_text("server:\n  execute_timeout_seconds: 1\n")
    with ServerProcess(folder / "models", "--config", str(config), strict=True) as process:
        yield process


def _infer(server: ServerProcess, model: str, value: float) -> tuple[str, float]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], np.float32))
    started = time.monotonic()
    try:
        client.infer(model, [tensor])
        outcome = "ok"
    except InferenceServerException as exc:
        outcome = str(exc)
    finally:
        client.close()  # in the thread that made it: gevent's pool cannot be joined from another thread's collector
    return outcome, time.monotonic() - started


def _ready(server: ServerProcess, model: str) -> bool:
    return httpx.get(f"http://{server.http_url}/v2/models/{model}/ready").status_code == 200


def _wait_ready(server: ServerProcess, model: str, timeout: float) -> float:
    started = time.monotonic()
    while not _ready(server, model):
        assert time.monotonic() - started < timeout, f"{model} not ready again after {timeout}s"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_hung_worker_is_answered_and_recycled(served):
    outcome, seconds = _infer(served, "hangs_in_worker", -1)
    assert "execute did not finish within 1s" in outcome and seconds < 3
    _wait_ready(served, "hangs_in_worker", timeout=30)  # a fresh worker, well before the old one would have woken
    assert _infer(served, "hangs_in_worker", 1) == ("ok", pytest.approx(0, abs=2))


def test_an_instance_stuck_in_a_thread_keeps_the_model_unready_until_it_returns(served):
    outcome: list[tuple[str, float]] = []
    caller = threading.Thread(target=lambda: outcome.append(_infer(served, "hangs_in_thread", -1)))
    caller.start()
    caller.join(4)
    assert outcome and "did not finish within 1s" in outcome[0][0] and outcome[0][1] < 3  # answered at the timeout
    assert not _ready(served, "hangs_in_thread")  # its one instance still runs the hung execution
    index = {row["name"]: row for row in httpx.post(f"http://{served.http_url}/v2/repository/index").json()}
    assert index["hangs_in_thread"]["state"] == "UNAVAILABLE"
    assert "past its 1s execute timeout" in index["hangs_in_thread"]["reason"]
    assert httpx.get(f"http://{served.http_url}/v2/health/ready").status_code != 200  # strict readiness says so too
    _wait_ready(served, "hangs_in_thread", timeout=10)  # the sleep returned: the instance serves again
    assert _infer(served, "hangs_in_thread", 1)[0] == "ok"
