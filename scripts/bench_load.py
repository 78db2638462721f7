"""The closed-loop tritonclient load of ``scripts.bench_vs_triton`` (and the scripts built on it), run in a process
of its own: ``load()`` starts it pinned to CPU 1 and returns what it measured.

gRPC with tritonclient.grpc.aio, HTTP with the synchronous tritonclient.http in threads (its aio client takes ~30 ms
per 600 KB answer and asks for gzip: with it the client, and compression, are what an HTTP run would measure), one
client each, inputs and outputs as binary data. Every call is counted: one that raises is ``failed``, an answer
whose outputs are not the model's (``scripts.bench_models.expected_outputs``) is ``wrong``; at concurrency 1 every
answer is checked, above it every ``SAMPLE_EVERY``-th. The rate counts good answers only.

    python -m scripts.bench_load PROTOCOL URL MODEL CONCURRENCY REQUESTS REPOSITORY  (REPOSITORY "": no checks)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from scripts.bench_models import OUTPUTS, SHAPES, answer_problem, expected_outputs, warm_up_requests

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_EVERY = 8  # above concurrency 1, one answer in this many is checked


class Tally:
    """Calls counted by outcome, latencies of the good ones, the first problem's words; thread-safe."""

    def __init__(self, expected: dict[str, np.ndarray], check_every: int) -> None:
        self.expected, self.check_every = expected, check_every
        self.latencies: list[float] = []
        self.ok = self.failed = self.wrong = self.answered = 0
        self.first_problem = ""
        self.lock = threading.Lock()

    def answer(self, took: float, output: Callable[[str], np.ndarray | None]) -> None:
        with self.lock:
            self.answered += 1
            check = self.answered % self.check_every == 0
        problem = self._problem(output) if check else None
        with self.lock:
            if problem is None:
                self.ok += 1
                self.latencies.append(took)
            else:
                self.wrong += 1
                self.first_problem = self.first_problem or problem

    def failure(self, error: BaseException) -> None:
        with self.lock:
            self.failed += 1
            self.first_problem = self.first_problem or f"{type(error).__name__}: {error}"[:300]

    def _problem(self, output: Callable[[str], np.ndarray | None]) -> str | None:
        for name, value in self.expected.items():
            got = output(name)
            if got is None:
                return f"no output {name}"
            if (why := answer_problem(value, got)) is not None:
                return f"{name}: {why}"
        return None


async def grpc_run(url: str, model: str, concurrency: int, total: int, arrays: list, tally: Tally,
                   warm: Tally) -> float:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, shape, array in arrays:
        tensor = grpcclient.InferInput(name, shape, "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)

    async def call(into: Tally) -> None:
        start = time.perf_counter()
        try:
            result = await client.infer(model, inputs)
        except Exception as error:  # noqa: BLE001 - every failed call is counted, whatever raised
            into.failure(error)
            return
        into.answer(time.perf_counter() - start, result.as_numpy)

    for _ in range(warm_up_requests(model)):
        await call(warm)
    left = total

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call(tally)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await client.close()
    return elapsed


def http_run(url: str, model: str, concurrency: int, total: int, arrays: list, tally: Tally, warm: Tally) -> float:
    import tritonclient.http as httpclient

    def client_and_request():
        client = httpclient.InferenceServerClient(url, network_timeout=120.0)
        inputs = []
        for name, shape, array in arrays:
            tensor = httpclient.InferInput(name, shape, "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        return client, inputs, [httpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS[model]]

    def call(client, inputs, requested, into: Tally) -> None:
        start = time.perf_counter()
        try:
            result = client.infer(model, inputs, outputs=requested)
        except Exception as error:  # noqa: BLE001 - every failed call is counted, whatever raised
            into.failure(error)
            return
        into.answer(time.perf_counter() - start, result.as_numpy)

    client, inputs, requested = client_and_request()
    for _ in range(warm_up_requests(model)):
        call(client, inputs, requested, warm)
    client.close()
    left, lock = [total], threading.Lock()
    start_line = threading.Barrier(concurrency + 1)

    def worker() -> None:
        client, inputs, requested = client_and_request()
        start_line.wait()
        while True:
            with lock:
                if left[0] <= 0:
                    break
                left[0] -= 1
            call(client, inputs, requested, tally)
        client.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join(600)
    return time.perf_counter() - began


def run(protocol: str, url: str, model: str, concurrency: int, total: int, repository: Path | None) -> dict:
    """One load; ``repository`` None: the answers are not checked (an echo server's, which are its inputs)."""
    rng = np.random.default_rng(0)
    arrays = [(name, shape, rng.random(shape, dtype=np.float32)) for name, shape in SHAPES[model]]
    expected = {} if repository is None else expected_outputs(model, [array for _, _, array in arrays], repository)
    tally = Tally(expected, 1 if concurrency == 1 else SAMPLE_EVERY)
    warm = Tally(expected, 1)
    if protocol == "http":
        elapsed = http_run(url, model, concurrency, total, arrays, tally, warm)
    else:
        elapsed = asyncio.run(grpc_run(url, model, concurrency, total, arrays, tally, warm))
    latencies = sorted(tally.latencies) or [float("nan")]
    return {"rps": tally.ok / elapsed, "ok": tally.ok, "failed": tally.failed + warm.failed,
            "wrong": tally.wrong + warm.wrong, "first_problem": tally.first_problem or warm.first_problem,
            "warm_ok": warm.ok, "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)]}


def pinned(cpu: int) -> list[str]:
    """The command prefix that pins a process to ``cpu`` (none on a one-CPU machine)."""
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) > 1 and shutil.which("taskset") else []


def load(protocol: str, port: int, model: str, concurrency: int, requests: int, repository: Path | None) -> dict:
    """The load in a process of its own, pinned to CPU 1: its rate (good answers a second), latencies, the calls
    that failed or came back wrong (answers checked against ``repository``'s model; None: not checked), and
    ``served``, the good answers the server gave (the warm-up's too: a server's CPU per request divides by it)."""
    command = [*pinned(1), sys.executable, "-m", "scripts.bench_load", protocol, f"127.0.0.1:{port}", model,
               str(concurrency), str(requests), str(repository or "")]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if finished.returncode != 0:
        return {"rps": 0.0, "ok": 0, "failed": requests, "wrong": 0, "warm_ok": 0, "served": 0,
                "p50_ms": float("nan"), "p99_ms": float("nan"),
                "first_problem": f"the load exited {finished.returncode}: {finished.stderr.strip()[-300:]}"}
    result = json.loads(finished.stdout)
    return {**result, "served": result["ok"] + result["warm_ok"]}


def bad_calls(result: dict) -> int:
    """The calls of a load that failed or were answered wrongly."""
    return result["failed"] + result["wrong"]


if __name__ == "__main__":
    protocol, url, model, concurrency, total, repository = sys.argv[1:7]
    print(json.dumps(run(protocol, url, model, int(concurrency), int(total), Path(repository) if repository else None)))
