"""Overload soak (checklist #11): at several times capacity, admitted requests keep a bounded latency, the only
errors are admission 503s, liveness holds, and memory, file descriptors and threads stay flat."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.support import ServerProcess, settled, write_model

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 default_queue_policy { max_queue_size: 16 } }
"""
MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""
BODY = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def resources(pid: int) -> dict[str, int]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss": int(status["VmRSS"].split()[0]) * 1024, "threads": int(status["Threads"]),
            "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}


def settled_resources(pid: int, timeout: float = 3.0) -> dict[str, int]:
    """``resources`` once the server has closed the connections a load just dropped (the file-descriptor count
    stops moving), so that two snapshots compare steady states, not sockets caught mid-close."""
    return settled(lambda: resources(pid), steady=2, interval=0.1, timeout=timeout, key=lambda found: found["fds"])


async def _load(url: str, seconds: float, clients: int) -> tuple[list[int], list[float], list[bool]]:
    statuses: list[int] = []
    latencies: list[float] = []
    alive: list[bool] = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=f"http://{url}", timeout=30,
                                 limits=httpx.Limits(max_connections=clients + 4)) as client:
        async def worker() -> None:
            while time.monotonic() < end:
                started = time.monotonic()
                response = await client.post("/v2/models/slow/infer", json=BODY)
                statuses.append(response.status_code)
                if response.status_code == 200:
                    latencies.append(time.monotonic() - started)

        async def probe() -> None:
            while time.monotonic() < end:
                alive.append((await client.get("/v2/health/live")).status_code == 200)
                await asyncio.sleep(0.1)

        await asyncio.gather(*(worker() for _ in range(clients)), probe())
    return statuses, latencies, alive


def test_overload_soak_keeps_resources_flat(tmp_path):
    write_model(tmp_path / "models", "slow", CONFIG, {"1/model.py": MODEL})
    process = ServerProcess(tmp_path / "models").start()
    try:
        pid = process.process.pid
        asyncio.run(_load(process.http_url, 2.0, 64))  # warm: pools, caches and threads reach their size
        before = settled_resources(pid)
        statuses, latencies, alive = asyncio.run(_load(process.http_url, 8.0, 64))
        after = settled_resources(pid)
        assert set(statuses) <= {200, 503}, sorted(set(statuses))
        assert statuses.count(503) > 0 and statuses.count(200) > 100  # really overloaded, and still serving
        latencies.sort()
        # The load generator shares the machine and inflates what it measures: judge the server by its own
        # account of queueing, and the client's p99 only loosely (on a VM running several times slower than usual
        # it measured 5.3 s while the server's mean queueing stayed under its bound).
        queue = httpx.get(f"http://{process.http_url}/v2/models/slow/stats").json()["model_stats"][0][
            "inference_stats"]["queue"]
        assert queue["ns"] / queue["count"] < 0.1e9, queue
        assert latencies[int(len(latencies) * 0.99)] < 10.0
        assert alive and all(alive)
        assert after["rss"] - before["rss"] < 50 << 20, (before, after)
        assert after["fds"] - before["fds"] <= 10, (before, after)
        assert after["threads"] - before["threads"] <= 4, (before, after)
    finally:
        assert process.stop() == 0, process.log()
