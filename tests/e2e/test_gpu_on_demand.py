"""Model control on_demand under a GPU memory budget, on a host with an NVIDIA GPU (``pytest -m gpu``).

Six TorchScript models (128 MiB of weights each, in the server's process) and two Python models (a worker each,
with its own CUDA context and 128 MiB on the GPU) share a budget that fits one worker and four TorchScript models
beside the server's context. Random traffic with a skew from four clients: every answer is correct, evictions
happen, and once each model has been measured (a first pass loads them all) the GPU's used memory, read by NVML
every few milliseconds, never grows past the budget.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support import GPU_TESTS, ServerProcess, cuda_available, write_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason=GPU_TESTS)]

MIB = 1 << 20
WEIGHT_MIB = 128
TORCH_MODELS = [f"torch{k}" for k in range(6)]
PYTHON_MODELS = ["python6", "python7"]
TORCH_CONFIG = """
    platform: "pytorch_libtorch"
    max_batch_size: 0
    input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    instance_group [ { kind: KIND_GPU count: 1 } ]
"""
PYTHON_CONFIG = TORCH_CONFIG.replace('platform: "pytorch_libtorch"', 'backend: "python"')
PYTHON_MODEL = f'''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.device = torch.device(f"cuda:{{args['model_instance_device_id']}}")
        number = float(args["model_name"].removeprefix("python"))
        self.weight = torch.full(({WEIGHT_MIB} << 18,), number, device=self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            values = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "INPUT__0").as_numpy())
            out = (values.to(self.device) + self.weight[0]).cpu().numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT__0", out.astype(np.float32))]))
        return responses
'''
CONTEXT_PROBE = """
import sys, torch
torch.zeros(1, device="cuda")
print("ready", flush=True)
sys.stdin.read()
"""


def _gpu_used() -> int:
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used


def _context_bytes() -> int:
    """What a process's CUDA context (torch's, as the server's and each worker's) takes on this GPU."""
    before = _gpu_used()
    probe = subprocess.Popen([sys.executable, "-c", CONTEXT_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert probe.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        return _gpu_used() - before
    finally:
        probe.communicate("")


def _build(repository: Path) -> None:
    import torch

    class Weighted(torch.nn.Module):
        def __init__(self, number: float) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((WEIGHT_MIB << 18,), number), requires_grad=False)

        def forward(self, values: torch.Tensor) -> torch.Tensor:
            return values + self.weight[0]

    for name in TORCH_MODELS:
        write_model(repository, name, TORCH_CONFIG)
        (repository / name / "1").mkdir()
        torch.jit.save(torch.jit.script(Weighted(float(name.removeprefix("torch")))),
                       str(repository / name / "1" / "model.pt"))
    for name in PYTHON_MODELS:
        write_model(repository, name, PYTHON_CONFIG, {"1/model.py": PYTHON_MODEL})


class _Sampler(threading.Thread):
    """The GPU's used memory every 5 ms: the peak."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.stopped = 0, threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.005):
            self.peak = max(self.peak, _gpu_used())


def _metric(text: str, name: str) -> dict[str, float]:
    return {labels: float(value) for labels, value in re.findall(rf"^{name}(\{{[^}}]*\}}|) (\S+)$", text, re.M)}


def test_on_demand_keeps_the_gpu_within_its_budget_under_skewed_traffic(tmp_path):
    repository = tmp_path / "models"
    _build(repository)
    context = _context_bytes()
    budget = 2 * context + (5 * WEIGHT_MIB + 96) * MIB  # the server's context, one worker's, five models' weights
    baseline = _gpu_used()
    server = ServerProcess(repository, "--device", "gpu", "--model-control-mode", "on_demand",
                           "--gpu-memory-budget-bytes", str(budget), "--keep-warm-seconds", "0",
                           log=tmp_path / "server.log").start(timeout=300)
    try:
        clients = threading.local()  # a tritonclient HTTP client is for one thread

        def call(name: str) -> float:
            if not hasattr(clients, "client"):
                clients.client = httpclient.InferenceServerClient(server.http_url)
            client = clients.client
            values = np.arange(4, dtype=np.float32)
            tensor = httpclient.InferInput("INPUT__0", [4], "FP32")
            tensor.set_data_from_numpy(values)
            started = time.perf_counter()
            answer = client.infer(name, [tensor]).as_numpy("OUTPUT__0")
            number = float(name.removeprefix("torch").removeprefix("python"))
            np.testing.assert_allclose(answer, values + number)
            return time.perf_counter() - started

        # each model measured at a load, and the Python ones at an unload too (what they grew to after it)
        first = {name: call(name) for name in TORCH_MODELS + PYTHON_MODELS}
        call(PYTHON_MODELS[0])
        sampler = _Sampler()
        sampler.start()
        names = TORCH_MODELS + PYTHON_MODELS
        weights = [8, 4, 3, 2, 1, 1, 2, 1]
        traffic = random.Random(7).choices(names, weights, k=64)
        with ThreadPoolExecutor(4) as pool:
            times = list(pool.map(call, traffic))
        sampler.stopped.set()
        sampler.join()
        text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    finally:
        assert server.stop() == 0, server.log()
    evicted = _metric(text, "serverless_triton_on_demand_unloads")['{reason="evicted"}']
    held = _metric(text, "serverless_triton_model_gpu_resident_bytes")
    overhead = sum(_metric(text, "serverless_triton_gpu_memory_overhead_bytes").values())
    peak = sampler.peak - baseline
    print(f"\ncontext {context / MIB:.0f} MiB, budget {budget / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB over the "
          f"baseline, {evicted:.0f} evictions, held now {sum(held.values()) / MIB:.0f} MiB + overhead "
          f"{overhead / MIB:.0f} MiB; first calls (s): " + ", ".join(f"{n} {t:.2f}" for n, t in first.items())
          + f"; random phase: p50 {np.median(times) * 1000:.1f} ms, max {max(times) * 1000:.0f} ms")
    print("held by model (MiB):", {labels: round(value / MIB) for labels, value in held.items()})
    print("\n".join(line for line in server.log().splitlines() if "on demand" in line or "unloaded model" in line))
    assert evicted > 0
    assert sum(held.values()) + overhead <= budget
    assert peak <= budget, server.log()
