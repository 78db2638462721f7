"""Side by side with real Triton: the same three Python-backend models, the same client, one run.

Each server (real Triton 2.51 from the nvidia-pytriton wheel, prepared by scripts/triton_oracle.sh, and
ours) runs with its whole process tree pinned to CPU 0, measured one at a time; the closed-loop tritonclient
load generator runs on CPU 1 (on a one-CPU machine nothing is pinned), as ``../shared/bench-vs-triton/load.py``
drives it: gRPC with tritonclient.grpc.aio, HTTP with the synchronous tritonclient.http in threads, one client
each, inputs and outputs as binary data (tritonclient.http.aio takes ~30 ms per 600 KB answer and asks for gzip:
with it the client, and compression, are what an HTTP run measures).  Printed as ours / Triton ratios, from one
run.

- ``add_sub_batch``: a tiny model with dynamic batching: the per-request overhead.
- ``identity_big``: 600 KB in and out per request: the data path (copies, IPC).
- ``resnet50_pt``: the deployment guide's model.py, over a small TorchScript conv net.
- ``add_sub_onnx`` (ours only): add_sub_batch as an ONNX model with the same dynamic batching. The wheel's
  Triton has only the Python backend, so its row is against Triton's ``add_sub_batch``.

Besides the ratios it prints the concurrency-1 p50 latency of ours minus Triton's, against a 0.1 ms target, and
the stacks' own floors measured in the same run: ``scripts.benchmark``'s echo servers on the native edge and
on grpcio's thread-pool server (ModelInfer answered with its inputs, no model, no checks) under the same load for
add_sub_batch, and ``scripts.http_echo`` (our HTTP listener answering infer requests with their inputs) for
add_sub_batch and identity_big, pinned like the servers, beside Triton's rate and CPU per request.

Each point is the better of two rounds (``--rounds``); the servers run side by side and take turns point by point
(the order reversed each round), so that the two figures of a ratio are measured seconds apart.

Usage: python -m scripts.bench_vs_triton [--requests N] [--concurrency 1 32] [--protocols grpc http] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

if __package__ in (None, ""):  # run as a file (python scripts/bench_vs_triton.py): the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.servers import prepare_oracle  # noqa: E402
from tests.support import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

ADD_SUB = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        out0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(config, "OUTPUT1")
        self.dtype0 = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.dtype1 = pb_utils.triton_string_to_numpy(out1["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype0)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype1))]))
        return responses
'''
ADD_SUB_CONFIG = '''
name: "add_sub_batch"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
'''
IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''
IDENTITY_CONFIG = '''
name: "identity_big"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 150528 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 150528 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
'''
# The deployment guide's model.py, unmodified in what it does.
RESNET = '''
import json, os, torch
from torch.utils.dlpack import from_dlpack, to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT__0")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self.model_directory = os.path.dirname(os.path.realpath(__file__))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model_path = os.path.join(self.model_directory, "model.pt")
        if not os.path.exists(model_path):
            raise pb_utils.TritonModelException("Cannot find the pytorch model")
        self.model = torch.jit.load(model_path).to(self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            input_tensor = pb_utils.get_input_tensor_by_name(request, "INPUT__0")
            pytorch_tensor = from_dlpack(input_tensor.to_dlpack())
            if pytorch_tensor.shape[2] > 1000 or pytorch_tensor.shape[3] > 1000:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    "Image shape should not be larger than 1000")))
                continue
            prediction = self.model(pytorch_tensor.to(self.device))
            out_tensor = pb_utils.Tensor.from_dlpack("OUTPUT__0", to_dlpack(prediction))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_tensor]))
        return responses
'''
RESNET_CONFIG = '''
name: "resnet50_pt"
backend: "python"
max_batch_size: 128
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
parameters: { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
'''
ADD_SUB_ONNX_CONFIG = ADD_SUB_CONFIG.replace('name: "add_sub_batch"\nbackend: "python"',
                                            'name: "add_sub_onnx"\nplatform: "onnxruntime_onnx"')
SHAPES = {"add_sub_batch": [("INPUT0", [1, 4]), ("INPUT1", [1, 4])], "identity_big": [("INPUT0", [1, 150528])],
          "resnet50_pt": [("INPUT__0", [1, 3, 224, 224])], "add_sub_onnx": [("INPUT0", [1, 4]), ("INPUT1", [1, 4])]}
OUTPUTS = {"add_sub_batch": ["OUTPUT0", "OUTPUT1"], "identity_big": ["OUTPUT0"], "resnet50_pt": ["OUTPUT__0"],
           "add_sub_onnx": ["OUTPUT0", "OUTPUT1"]}
MODELS = tuple(SHAPES)
# Where the echo is the floor of the same exchange: its answer is add_sub's size.  (Its identity_big answer builds the
# tensor into the message, two copies our server does not make: measured slower than our server, it is no floor.)
FLOOR_MODELS = ("add_sub_batch",)
HTTP_FLOOR_MODELS = ("add_sub_batch", "identity_big")  # answers of the model's size (resnet50_pt's is not its input's)
OURS_ONLY = {"add_sub_onnx": "add_sub_batch"}  # a model Triton's wheel cannot serve -> the Triton row it is held to
LATENCY_TARGET_MS = 0.1  # ours - Triton, p50 at concurrency 1


def build_repository(root: Path, server: str = "ours") -> Path:
    """The models ``server`` serves: Triton gets the Python-backend ones, we get those and ``add_sub_onnx``."""
    import torch

    from examples.build_models import build_add_sub_onnx

    models = (("add_sub_batch", ADD_SUB, ADD_SUB_CONFIG), ("identity_big", IDENTITY, IDENTITY_CONFIG),
              ("resnet50_pt", RESNET, RESNET_CONFIG))
    for name, source, config in models:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())
        (root / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    if server == "ours":
        build_add_sub_onnx(root / "add_sub_onnx" / "1" / "model.onnx", dims=4)
        (root / "add_sub_onnx" / "config.pbtxt").write_text(textwrap.dedent(ADD_SUB_ONNX_CONFIG).lstrip())

    class Net(torch.nn.Module):  # a conv stem, pool and linear: [N,3,H,W] -> [N,1000]
        def __init__(self) -> None:
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 32, kernel_size=7, stride=4, padding=3)
            self.fc = torch.nn.Linear(32, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.stem(x)).mean(dim=(2, 3)))

    torch.manual_seed(0)
    torch.jit.script(Net().eval()).save(str(root / "resnet50_pt" / "1" / "model.pt"))
    return root


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) > 1 and shutil.which("taskset") else []


def start_triton(repository: Path, workdir: Path) -> tuple[subprocess.Popen, int, int]:
    home = prepare_oracle()
    python = str(home / "venv" / "bin" / "python")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0:  # resnet50_pt needs it
        subprocess.run([python, "-m", "pip", "install", "-q", "torch==2.13.0"], check=True, capture_output=True)
    site = (home / "ready").read_text().strip()
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": f"{site}/nvidia_pytriton.libs", "PYTHONPATH": site,
           "PATH": f"{home / 'venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    server = home / "tritonserver"
    cwd = workdir / "triton-cwd"  # no triton_python_backend_utils.py here: the stub would import it first
    cwd.mkdir(exist_ok=True)
    command = [*pinned(0), str(server / "bin" / "tritonserver"), f"--model-repository={repository}",
               f"--backend-directory={server / 'backends'}", f"--cache-directory={server / 'caches'}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
               f"--http-port={http}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics}"]
    log = open(workdir / "triton.log", "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=log), http, grpc_port


def start_ours(repository: Path, workdir: Path, root: Path = ROOT, env: dict[str, str] | None = None,
               log_name: str = "ours.log") -> tuple[subprocess.Popen, int, int]:
    """Our server from the checkout at ``root`` (``env`` added to this process's environment)."""
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    command = [*pinned(0), sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port),
               "--metrics-port", str(metrics), "--device", "cpu"]
    log = open(workdir / log_name, "wb")  # noqa: SIM115
    return (subprocess.Popen(command, cwd=root, env={**os.environ, **(env or {})}, stdout=log, stderr=log), http,
            grpc_port)


FLOORS = {"floor": "grpc.aio echo", "floor-threads": "grpcio thread-pool echo", "floor-native": "native edge echo",
          "floor-http": "granian echo reading and answering as ours does"}
FLOOR_STACKS = {"floor": "aio", "floor-threads": "threads", "floor-native": "native"}


def start_grpc_floor(stack: str = "native") -> tuple[subprocess.Popen, None, int]:
    """The gRPC stack's own cost, pinned like the servers: ``scripts.benchmark``'s echo server on ``stack`` (the
    native edge, the one ours runs on by default; grpcio's thread-pool server; grpc.aio), which answers ModelInfer
    with its inputs (no model, no checks), started and answering ServerLive."""
    process, port = _start_echo(lambda port: ["scripts.benchmark", "--echo-server", str(port), "--echo-stack", stack],
                                lambda process, port: wait_grpc_live(port, process))
    return process, None, port


def start_http_floor() -> tuple[subprocess.Popen, int, int]:
    """The HTTP stack's own cost, pinned like the servers: ``scripts.http_echo`` (our listener, a bare ASGI echo),
    answering already."""
    process, port = _start_echo(lambda port: ["scripts.http_echo", str(port)],
                                lambda process, port: wait_ready(process, port, timeout=60.0))
    return process, port, 0


def _start_echo(arguments: Callable[[int], list[str]],
                answering: Callable[[subprocess.Popen, int], None]) -> tuple[subprocess.Popen, int]:
    """An echo server (``python -m`` with ``arguments(port)``) on a free port, pinned like the servers, once
    ``answering`` says it answers; stopped if it never does."""
    port = free_port()
    command = [*pinned(0), sys.executable, "-m", *arguments(port)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        answering(process, port)
    except (TimeoutError, RuntimeError):
        stop_tree(process)
        raise
    return process, port


def wait_grpc_live(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until a gRPC server answers ServerLive; TimeoutError if it has not by ``timeout`` or has exited."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        while True:
            try:
                stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise TimeoutError(f"the gRPC server on port {port} did not start") from None
                time.sleep(0.1)


def stop_tree(process: subprocess.Popen) -> None:
    """Stop a server and every process under it (Triton's Python stubs outlive it a while otherwise, and would
    take CPU from the next server)."""
    tree = [process.pid]
    try:
        tree += [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
    _, alive = psutil.wait_procs([p for p in map(_process, tree) if p is not None], timeout=30)
    for leftover in alive:
        leftover.kill()
    time.sleep(2)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the server and every process under it have used so far: per request, steadier
    than a rate on a shared machine, and it counts the model processes (Triton's stubs, our workers) too."""
    total = 0.0
    root = _process(pid)
    for process in [root, *root.children(recursive=True)] if root else []:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def wait_ready(process: subprocess.Popen, http_port: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError("the server did not get ready")


LOAD = '''
import asyncio, json, sys, threading, time
import numpy as np
protocol, url, model, concurrency, total, shapes, outputs, warm_up = sys.argv[1], sys.argv[2], sys.argv[3], \\
    int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]), json.loads(sys.argv[7]), int(sys.argv[8])
rng = np.random.default_rng(0)
arrays = [(name, shape, rng.random(shape, dtype=np.float32)) for name, shape in shapes]


async def grpc_run():
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, shape, array in arrays:
        tensor = grpcclient.InferInput(name, shape, "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    for _ in range(warm_up):
        await client.infer(model, inputs)
    latencies, errors, left = [], 0, total

    async def worker():
        nonlocal left, errors
        while left > 0:
            left -= 1
            start = time.perf_counter()
            try:
                await client.infer(model, inputs)
                latencies.append(time.perf_counter() - start)
            except Exception:
                errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await client.close()
    return latencies, errors, elapsed


def http_run():
    import tritonclient.http as httpclient

    def client_and_request():
        client = httpclient.InferenceServerClient(url, network_timeout=120.0)
        inputs = []
        for name, shape, array in arrays:
            tensor = httpclient.InferInput(name, shape, "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        return client, inputs, [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]

    warm, inputs, requested = client_and_request()
    for _ in range(warm_up):
        warm.infer(model, inputs, outputs=requested)
    warm.close()
    latencies, errors, left, lock = [], [0], [total], threading.Lock()
    start_line = threading.Barrier(concurrency + 1)

    def worker():
        client, inputs, requested = client_and_request()
        start_line.wait()
        while True:
            with lock:
                if left[0] <= 0:
                    break
                left[0] -= 1
            start = time.perf_counter()
            try:
                client.infer(model, inputs, outputs=requested)
                took = time.perf_counter() - start
                with lock:
                    latencies.append(took)
            except Exception:
                with lock:
                    errors[0] += 1
        client.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join(600)
    return latencies, errors[0], time.perf_counter() - began


latencies, errors, elapsed = http_run() if protocol == "http" else asyncio.run(grpc_run())
latencies.sort()
p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
print(json.dumps({"rps": len(latencies) / elapsed, "errors": errors, "p50_ms": 1000 * p50, "p99_ms": 1000 * p99}))
'''


WARM_UP_REQUESTS = 20  # sent by the load before the measured ones


def load(protocol: str, port: int, model: str, concurrency: int, requests: int) -> dict:
    """The closed-loop client in a process of its own, pinned to CPU 1: its rate and latencies, and ``served``, the
    requests the server answered (the warm-up's too: a server's CPU per request divides by it)."""
    command = [*pinned(1), sys.executable, "-c", LOAD, protocol, f"127.0.0.1:{port}", model, str(concurrency),
               str(requests), json.dumps(SHAPES[model]), json.dumps(OUTPUTS[model]), str(WARM_UP_REQUESTS)]
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return {**result, "served": requests + WARM_UP_REQUESTS}


def point_requests(model: str, requests: int) -> int:
    """The measured requests of a point: ``requests`` for the small models, a third of it for the large ones."""
    return requests if model.startswith("add_sub") else requests // 3


def side_by_side(requests: int = 3000, concurrency: tuple[int, ...] = (1, 32),
                 protocols: tuple[str, ...] = ("grpc", "http"),
                 servers: tuple[str, ...] = ("triton", "ours"), rounds: int = 2) -> list[dict]:
    """Every (protocol, model, concurrency) point for Triton and for us, one dict each: the better of ``rounds``
    rounds. Every server runs from the start, all pinned to CPU 0 (one that is not being measured takes no CPU to
    speak of: Triton 0%, ours 0.4%), and the servers take turns point by point, the order reversed every round, so
    that each ratio compares measurements seconds apart: this machine's speed drifts by tens of percent over the
    minutes a whole round of one server takes, which weighed on one server's round, not on a point."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-vs-triton-"))
    rows: list[dict] = []
    running: dict[str, tuple[subprocess.Popen, int | None, int]] = {}
    try:
        for server in servers:
            running[server] = _start_server(server, workdir)
        for server, (process, http_port, _) in running.items():
            if server not in FLOORS:
                wait_ready(process, http_port)
        for round_index in range(rounds):
            order = list(running) if round_index % 2 == 0 else list(reversed(running))
            for protocol in protocols:
                for model in MODELS:
                    count = point_requests(model, requests)
                    for c in concurrency:
                        for server in order:
                            if not _serves(server, protocol, model):
                                continue
                            process, http_port, grpc_port = running[server]
                            port = grpc_port if protocol == "grpc" else http_port
                            rows.append(_measure(server, process, protocol, port, model, c, count))
    finally:
        for process, _, _ in running.values():
            stop_tree(process)
        shutil.rmtree(workdir, ignore_errors=True)
    best: dict[tuple, dict] = {}
    for row in rows:
        point = (row["server"], row["protocol"], row["model"], row["c"])
        if point not in best or row["rps"] > best[point]["rps"]:
            best[point] = row
    return list(best.values())


def _start_server(server: str, workdir: Path) -> tuple[subprocess.Popen, int | None, int]:
    """``server`` started (a floor: answering already; Triton and ours: see ``wait_ready``): (its process, HTTP
    port or None, gRPC port)."""
    if server == "floor-http":
        return start_http_floor()
    if server in FLOORS:
        return start_grpc_floor(FLOOR_STACKS[server])
    repository = workdir / f"repo-{server}"
    build_repository(repository, server)
    return (start_triton if server == "triton" else start_ours)(repository, workdir)


def _serves(server: str, protocol: str, model: str) -> bool:
    """Whether ``server`` is measured at this point: Triton has no ``OURS_ONLY`` model, a floor only its model over
    gRPC."""
    if server == "triton":
        return model not in OURS_ONLY
    if server == "floor-http":
        return protocol == "http" and model in HTTP_FLOOR_MODELS
    if server in FLOORS:
        return protocol == "grpc" and model in FLOOR_MODELS
    return True


def _measure(server: str, process: subprocess.Popen, protocol: str, port: int, model: str, c: int,
             count: int) -> dict:
    """One point's row, printed as it is measured: the load's rate and latencies, and the server's CPU per request."""
    before = tree_cpu_seconds(process.pid)
    row = {"server": server, "protocol": protocol, "model": model, "c": c, **load(protocol, port, model, c, count)}
    row["cpu_us"] = (tree_cpu_seconds(process.pid) - before) / row["served"] * 1e6
    print(f"  {server:6} {protocol:4} {model:13} c={c:<3} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:.2f} ms  "
          f"p99 {row['p99_ms']:.2f} ms  server CPU {row['cpu_us']:.0f} us/req", flush=True)
    return row


# ours / Triton in requests per second, by (model, protocol, concurrency): issue #24's targets
TARGETS = {
    **{(model, protocol, c): 1.0 for model in ("identity_big", "resnet50_pt") for protocol in ("grpc", "http")
       for c in (1, 32)},
    ("add_sub_batch", "http", 32): 0.8, ("add_sub_batch", "grpc", 32): 0.6,
    ("add_sub_onnx", "http", 32): 1.0, ("add_sub_onnx", "grpc", 32): 1.0,
}


def ratios(rows: list[dict]) -> list[dict]:
    """ours / Triton per point, from one run (a model only we serve against the Triton row it is held to)."""
    triton = {(r["protocol"], r["model"], r["c"]): r for r in rows if r["server"] == "triton"}
    out = []
    for row in rows:
        theirs = triton.get((row["protocol"], OURS_ONLY.get(row["model"], row["model"]), row["c"]))
        if row["server"] == "ours" and theirs:
            out.append({"protocol": row["protocol"], "model": row["model"], "c": row["c"],
                        "ratio": row["rps"] / theirs["rps"], "ours": row["rps"], "triton": theirs["rps"],
                        "cpu_ratio": theirs["cpu_us"] / row["cpu_us"], "ours_cpu_us": row["cpu_us"],
                        "triton_cpu_us": theirs["cpu_us"], "p50_ms": row["p50_ms"], "triton_p50_ms": theirs["p50_ms"],
                        "goal": TARGETS.get((row["model"], row["protocol"], row["c"]))})
    return out


def targets(table: list[dict]) -> list[tuple[str, float, str, float, bool]]:
    """(what, measured, relation, goal, met) for the throughput targets (measured >= goal) and the p50 latency
    target at c=1 (measured <= goal)."""
    out = []
    for row in table:
        against = f" (vs Triton's {OURS_ONLY[row['model']]})" if row["model"] in OURS_ONLY else ""
        if row["goal"] is not None:
            out.append((f"{row['protocol']} {row['model']} c={row['c']} ours / Triton{against}", row["ratio"], ">=",
                        row["goal"], row["ratio"] >= row["goal"]))
        if row["c"] == 1 and row["model"] == "add_sub_batch":
            extra = row["p50_ms"] - row["triton_p50_ms"]
            out.append((f"{row['protocol']} add_sub_batch c=1 p50 ours - Triton, ms", extra, "<=", LATENCY_TARGET_MS,
                        extra <= LATENCY_TARGET_MS))
    return out


def floor_rows(rows: list[dict]) -> list[dict]:
    """The echo floor's points beside Triton's (rate ratio, CPU per request)."""
    triton = {(r["protocol"], r["model"], r["c"]): r for r in rows if r["server"] == "triton"}
    return [{**row, "ratio": row["rps"] / theirs["rps"], "triton_cpu_us": theirs["cpu_us"]} for row in rows
            if row["server"] in FLOORS and (theirs := triton.get((row["protocol"], row["model"], row["c"])))]


def print_ratios(table: list[dict], floors: list[dict] = ()) -> None:
    print("\nours / Triton (requests per second, same run; with its target), and Triton's server CPU per request /"
          " ours (the same measure of efficiency, less moved by a busy machine)")
    for row in table:
        goal = row["goal"]
        verdict = "" if goal is None else f"  target {goal:.1f}x: {'met' if row['ratio'] >= goal else 'NOT met'}"
        print(f"  {row['protocol']:4} {row['model']:13} c={row['c']:<3} {row['ratio']:5.2f}x "
              f"({row['ours']:.0f} vs {row['triton']:.0f}){verdict}   CPU/req {row['cpu_ratio']:.2f}x "
              f"({row['ours_cpu_us']:.0f} vs {row['triton_cpu_us']:.0f} us)")
    if any(row["model"] in OURS_ONLY for row in table):
        print("  (add_sub_onnx: our ONNX add_sub against Triton's Python add_sub_batch; the wheel has no ONNX backend)")
    for floor in floors:
        stack = "gRPC" if floor["protocol"] == "grpc" else "HTTP"
        print(f"  {floor['protocol']:4} {floor['model']:13} c={floor['c']:<3} the {stack} stack's floor "
              f"({FLOORS[floor['server']]}, no model): "
              f"{floor['rps']:.0f} req/s = {floor['ratio']:.2f}x Triton, {floor['cpu_us']:.0f} us of CPU per "
              f"request (Triton's whole server {floor['triton_cpu_us']:.0f})")
    for what, value, relation, goal, met in targets(table):
        if relation == "<=":  # the throughput targets are in the lines above
            print(f"  {what}: {value:+.2f} (target {relation} {goal:.1f}: {'met' if met else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--servers", nargs="+", default=["triton", "ours", "floor-native", "floor-threads",
                                                          "floor-http"],
                        choices=["triton", "ours", *FLOORS], help="floor-native, floor-threads, floor: the native "
                        "edge, grpcio thread-pool and grpc.aio echo servers (gRPC); floor-http: our HTTP listener's "
                        "echo (scripts.http_echo)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the servers taking turns at each point; the "
                        "better counts")
    args = parser.parse_args()
    rows = side_by_side(args.requests, tuple(args.concurrency), tuple(args.protocols), tuple(args.servers),
                        args.rounds)
    print_ratios(ratios(rows), floor_rows(rows))


if __name__ == "__main__":
    main()
