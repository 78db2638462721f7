"""Dynamic batching's priority levels as Triton 2.51 serves them (the order below was observed on it, and the
conformance suite sees it again on every run: tests/conformance/test_recorded.py): level 1 is taken first and each
level is first in, first out; priority 0 or past the last level means the default level; a level's own queue policy
bounds it (503 past its max_queue_size)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from runtime.scheduling.priority_queue import PriorityQueues
from tests.support import ServerProcess, write_model

CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  priority_queue_policy { key: 1 value: { max_queue_size: 2 } }
}
"""
# Answers with how many requests it executed before this one; a negative input holds the instance for a second
# (the file "holding" in the model's folder says it has begun).
MODEL = """
import itertools
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.counter = itertools.count()
        self.holding = os.path.join(args["model_repository"], "holding")

    def execute(self, requests):
        responses = []
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0, 0] < 0:
                open(self.holding, "w").close()
                time.sleep(1.0)
            out = np.array([[next(self.counter)]], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""
# (name, priority) in the order sent, while the first request holds the only instance
SENT = [("p2", 2), ("p0", 0), ("p3", 3), ("p1a", 1), ("p1b", 1), ("p1c", 1), ("p9", 9)]
# What Triton 2.51 answered: the order each ran in, and p1c refused (level 1 holds 2)
TRITON_ORDER = {"blocker": 0, "p1a": 1, "p1b": 2, "p2": 3, "p0": 4, "p9": 5, "p3": 6}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("priority")
    write_model(repository, "prio", CONFIG, {"1/model.py": MODEL})
    with ServerProcess(repository) as process:
        yield process


def pending(metrics_url: str, model: str = "prio") -> int:
    """The model's requests queued now (``nv_inference_pending_request_count``, which Triton reports too)."""
    text = httpx.get(f"http://{metrics_url}/metrics", timeout=10).text
    line = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    return int(float(text.split(line, 1)[1].split()[0])) if line in text else 0


def priority_run(module, url: str, metrics_url: str, holding: Path) -> dict[str, int | str]:
    """The requests of ``SENT`` while a first one holds the model's only instance, each sent once the one before is
    queued: name -> how many ran before it, or the error's words."""
    answers: dict[str, int | str] = {}

    def send(name: str, value: float, priority: int) -> None:
        client = module.InferenceServerClient(url)
        tensor = module.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], np.float32))
        try:
            answers[name] = int(client.infer("prio", [tensor], priority=priority).as_numpy("OUT")[0, 0])
        except InferenceServerException as exc:
            answers[name] = exc.message()

    holding.unlink(missing_ok=True)
    first = threading.Thread(target=send, args=("blocker", -1.0, 0))
    first.start()
    _until(holding.exists, "the first request never began")
    threads, queued = [], 0
    for name, priority in SENT:
        threads.append(threading.Thread(target=send, args=(name, 0.0, priority)))
        threads[-1].start()
        if name == "p1c":  # refused at once: level 1 holds 2
            threads[-1].join(10)
        else:
            queued += 1
            _until(lambda: pending(metrics_url) >= queued, f"{name} was never queued")  # noqa: B023
    for thread in [first, *threads]:
        thread.join(30)
    return answers


def _until(condition, why: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, why
        time.sleep(0.005)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_priority_levels_order_requests_as_triton(server, module):
    url = server.http_url if module is httpclient else server.grpc_url
    answers = priority_run(module, url, f"127.0.0.1:{server.metrics_port}",
                           Path(str(server.repository)) / "prio" / "holding")
    assert "Exceeds maximum queue size" in str(answers.pop("p1c"))
    ran = sorted(answers, key=answers.__getitem__)
    assert ran == sorted(TRITON_ORDER, key=TRITON_ORDER.__getitem__)


class _Item:
    def __init__(self, level: int) -> None:
        self.level = level


def test_queues_take_the_first_level_first_and_put_back_in_front():
    queues: PriorityQueues[_Item] = PriorityQueues(levels=3, default_level=2)
    assert [queues.index_of(p) for p in (0, 1, 2, 3, 4)] == [1, 0, 1, 2, 1]
    low, mid, high = _Item(2), _Item(1), _Item(0)
    queues.extend([low, mid, high])
    assert list(queues) == [high, mid, low] and queues.size(1) == 1
    taken = queues.pop()
    assert taken is high
    queues.put_back([taken])
    queues.sift(lambda item: True if item is mid else False)
    assert list(queues) == [high, low]
    queues.remove(low)
    assert list(queues.drain()) == [high] and not queues
    assert PriorityQueues().index_of(7) == 0  # no levels: one queue


def test_sifting_stops_once_the_batch_is_full_and_leaves_the_rest_in_order():
    """A batch taken from a long queue offers only what it needs: the items past it are never looked at."""
    queues: PriorityQueues[_Item] = PriorityQueues(levels=2, default_level=1)
    first, second = [_Item(0) for _ in range(3)], [_Item(1) for _ in range(50)]
    queues.extend(first + second)
    offered: list[_Item] = []
    taken: list[_Item] = []

    def wanted(item: _Item) -> bool:
        offered.append(item)
        if item is first[1]:
            return False  # left queued, in its place
        taken.append(item)
        return True

    queues.sift(wanted, lambda: len(taken) >= 4)
    assert taken == [first[0], first[2], second[0], second[1]]
    assert len(offered) == 5
    assert list(queues) == [first[1], *second[2:]]
