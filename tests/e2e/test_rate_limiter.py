"""Triton's rate limiter (--rate-limit=execution_count): two instances that each hold resource R while executing,
with one R to share, never execute at the same time; with two they do; an instance asking for more R than given
cannot load (Triton's words, checked against Triton 2.51).  The limiter's queueing is tested in process."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient

from runtime.errors import ModelLoadError
from runtime.scheduling.rate_limiter import RateLimiter
from tests.support import ServerProcess, write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 2 rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
"""
GREEDY_CONFIG = CONFIG.replace('name: "R" count: 1', 'name: "R" count: 3')
# Answers with when its execution began and ended.
MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        began = time.time()
        time.sleep(0.5)
        span = np.array([began, time.time()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def _spans(server: ServerProcess) -> list[tuple[float, float]]:
    spans = []

    def call() -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        spans.append(tuple(client.infer("limited", [tensor]).as_numpy("SPAN")))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(spans)


@pytest.mark.parametrize(("count", "overlap"), [("1", False), ("2", True)])
def test_instances_share_resources(tmp_path, count, overlap):
    repository = tmp_path / "models"
    write_model(repository, "limited", CONFIG, {"1/model.py": MODEL})
    write_model(repository, "greedy", GREEDY_CONFIG, {"1/model.py": MODEL})
    with ServerProcess(repository, "--rate-limit", "execution_count", "--rate-limit-resource", f"R:{count}",
                       strict=False) as server:
        (first, second) = _spans(server)
        assert bool(second[0] < first[1]) == overlap, (first, second)
        reason = {row["name"]: row.get("reason", "") for row in
                  httpclient.InferenceServerClient(server.http_url).get_model_repository_index()}["greedy"]
        assert f'Resource count for "R" is limited to {count} which will prevent scheduling' in reason


def test_waiters_are_served_by_priority_then_arrival():
    async def main():
        limiter = RateLimiter({"R": 1})
        limiter.admit("m", [(("R", 1),)])
        await limiter.acquire((("R", 1),))
        order = []

        async def wait(name: str, priority: int) -> None:
            await limiter.acquire((("R", 1),), priority)
            order.append(name)
            limiter.release((("R", 1),))

        tasks = [asyncio.create_task(wait(name, priority)) for name, priority in (("low", 2), ("high", 1),
                                                                                  ("high2", 1))]
        await asyncio.sleep(0)
        limiter.release((("R", 1),))
        await asyncio.gather(*tasks)
        assert order == ["high", "high2", "low"]
        with pytest.raises(ModelLoadError, match="the minimum required count is 2"):
            limiter.admit("big", [(("R", 2),)])
        grown = RateLimiter()
        grown.admit("m", [(("S", 2),), (("S", 3),)])
        assert grown.total == {"S": 3}  # no count given: the largest any instance asks for
    asyncio.run(main())
