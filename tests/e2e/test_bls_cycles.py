"""BLS calls in a cycle, many at once: a model calling itself with two instances, and two models calling each other.
Each chain of calls alone looks harmless; together they hold every instance while waiting for one.  Every request
must get an answer, quickly, and the models must serve afterwards (ten at once once hung seven past 60 s and left
the model wedged while it reported ready)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, write_model

# DEPTH > 0: sleep a little (so that concurrent requests all hold their instances), then call the next model of the
# cycle with DEPTH - 1 and answer what it answered; DEPTH 0: answer at once.
CALLER = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

NEXT = {"self_caller": "self_caller", "ping": "pong", "pong": "ping"}


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        depth = int(pb_utils.get_input_tensor_by_name(request, "DEPTH").as_numpy()[0])
        if depth == 0:
            return pb_utils.InferenceResponse([pb_utils.Tensor("HOPS", np.array([0], np.int32))])
        time.sleep(0.2)
        response = pb_utils.InferenceRequest(
            model_name=NEXT[self.name], requested_output_names=["HOPS"],
            inputs=[pb_utils.Tensor("DEPTH", np.array([depth - 1], np.int32))]).exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        hops = pb_utils.get_output_tensor_by_name(response, "HOPS").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("HOPS", hops + 1)])
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "DEPTH" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "HOPS" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: %d } ]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("bls_cycles") / "models"
    for name, instances in (("self_caller", 2), ("ping", 1), ("pong", 1)):
        write_model(root, name, CONFIG % instances, {"1/model.py": CALLER})
    with ServerProcess(root, strict=True) as process:
        yield process


def _call(server: ServerProcess, model: str, depth: int) -> tuple[str, float]:
    """("ok" or the error's text, seconds taken)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
    depth_input = httpclient.InferInput("DEPTH", [1], "INT32")
    depth_input.set_data_from_numpy(np.array([depth], np.int32))
    started = time.monotonic()
    try:
        hops = client.infer(model, [depth_input]).as_numpy("HOPS")[0]
        outcome = "ok" if hops == depth else f"wrong answer {hops}"
    except InferenceServerException as exc:
        outcome = str(exc)
    finally:
        client.close()  # in the thread that made it (callers run it in a pool): gevent's pool is joined there
    return outcome, time.monotonic() - started


def _all_at_once(server: ServerProcess, calls: list[tuple[str, int]]) -> list[tuple[str, float]]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: _call(server, *call), calls))


def _check_answered(outcomes: list[tuple[str, float]]) -> None:
    for outcome, seconds in outcomes:
        assert outcome == "ok" or "would wait forever" in outcome, outcome
        assert seconds < 10, (outcome, seconds)  # every request answered, none left waiting on the others
    assert any(outcome == "ok" for outcome, _ in outcomes)  # refusals only where the wait had no end


def test_a_model_calling_itself_many_times_at_once(served):
    _check_answered(_all_at_once(served, [("self_caller", 1)] * 10))
    assert _call(served, "self_caller", 1)[0] == "ok"  # not wedged: one call alone still nests once
    assert httpclient.InferenceServerClient(served.http_url).is_model_ready("self_caller")


def test_two_models_calling_each_other_at_once(served):
    outcomes = _all_at_once(served, [("ping", 1), ("pong", 1)] * 5)
    _check_answered(outcomes)
    assert any("would wait forever" in outcome for outcome, _ in outcomes)  # ping held waiting on pong, and back
    assert _call(served, "ping", 1)[0] == "ok" and _call(served, "pong", 1)[0] == "ok"


def test_a_cycle_through_both_models_alone_is_refused_at_once(served):
    outcome, seconds = _call(served, "ping", 2)  # ping -> pong -> ping: ping's one instance waits on itself
    assert "would wait forever" in outcome and seconds < 2
