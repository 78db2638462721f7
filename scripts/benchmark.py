"""Benchmark: our server against bare onnxruntime and Seldon MLServer, in one run.

    .venv/bin/python -m scripts.benchmark [--quick] [--skip-mlserver] [--skip-triton] [--skip-frontends] [--output F]

Starts `bootstrap run` on loopback with a generated repository (a compute-bound MLP and a
near-identity model, each with dynamic batching on and off), drives it with the real
tritonclient (gRPC and HTTP, asyncio, concurrency 1..64), and prints, for each point,
throughput and p50/p99 latency, plus these ratios:

- served throughput / bare in-process onnxruntime throughput at the same batch size
  (the request's batch size, and the mean batch size the server actually executed);
- dynamic batching on / off;
- our throughput / MLServer's (1.7.1, installed by this script into its own venv,
  serving the same ONNX file through a small custom MLModel) at the same concurrency;
- p50 latency overhead of the near-identity model over gRPC at concurrency 1, against a
  minimal gRPC echo server on the same stack (the floor for the client and grpcio alone): both servers up at once,
  measured in turns (``IDENTITY_ROUNDS`` rounds, the order reversed each round), the median of the paired
  differences;
- large JSON tensors: the server's peak memory growth per MiB of JSON while 4 requests of
  ~55 MiB of JSON arrive at once, and the slowest health answer meanwhile;
- side by side with real Triton 2.51 (scripts/bench_vs_triton.py): three Python-backend models,
  each server on one CPU, the client on another, as ours / Triton ratios (--skip-triton leaves it out);
- across cores (scripts/bench_frontends.py, needs h2load): the tiny Python model served by one process on one core,
  then by k front-end processes on k cores, against the target of 0.7·k (--skip-frontends leaves it out).

It ends with every target from this run in one list: the measured value, the goal, met or not.

Every server (ours, the echo server, MLServer) starts on CPU 0, bare onnxruntime is measured from CPU 0 too, and
the load generator runs on the other CPUs, so the client's own CPU is not taken from the servers (on a one-CPU
machine nothing is pinned). onnxruntime pins its intra-op threads to cores of its own choosing, outside that
mask, in the server and in the bare measurement alike. Bare onnxruntime is measured twice: with the session
options our server gives the model (intra-op threads that do not spin: the ratios and the target use this one,
so that the two differ only by the serving), and with onnxruntime's defaults (spinning threads), for reference.

Results also go to a JSON file.  Nothing here is a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from examples.build_models import build_dense_onnx, save_onnx
from scripts.bench_frontends import available as frontends_available
from scripts.bench_frontends import print_scaling, scaling
from scripts.bench_load import pinned
from scripts.bench_servers import wait_grpc_live
from scripts.bench_vs_triton import print_summary, side_by_side
from scripts.bench_vs_triton import summarize as summarize_vs_triton
from scripts.bench_vs_triton import targets as triton_targets
from tests.support import JSON_SUM, JSON_SUM_CONFIG

ROOT = Path(__file__).resolve().parent.parent

SERVER_CPU = 0  # every server, and bare onnxruntime; the load generator gets the rest
PINNING = (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity")


def pin_client() -> None:
    """This process (the load generator) off the servers' CPU."""
    if PINNING:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - {SERVER_CPU})


def unpin() -> None:
    """Every CPU again (the across-cores part places its servers and client itself, from this process's CPUs)."""
    if PINNING:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


WIDTH, LAYERS = 1024, 8
IDENTITY_WIDTH = 16
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
MAX_BATCH = 64
MLSERVER_VERSION = "1.7.1"
REQUEST_BATCH = 8

DENSE_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{batching}
"""
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 2000 }"


@dataclass
class Point:
    target: str
    model: str
    protocol: str
    concurrency: int
    requests: int
    seconds: float
    throughput: float  # inferences (samples) per second
    p50_ms: float
    p99_ms: float
    errors: int = 0
    mean_executed_batch: float | None = None


@dataclass
class Results:
    machine: dict
    bare_onnxruntime: dict = field(default_factory=dict)  # model -> {batch size: samples/s, latency}
    points: list[Point] = field(default_factory=list)
    ratios: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    json_memory: dict = field(default_factory=dict)
    vs_triton: list = field(default_factory=list)  # ours / real Triton, Python-backend models (bench_vs_triton)
    identity_vs_echo: dict = field(default_factory=dict)  # the near-identity model against the echo, paired rounds
    across_cores: list = field(default_factory=list)  # front-end processes on k cores (bench_frontends)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 120.0, process: subprocess.Popen | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready")


def build_repository(folder: Path) -> Path:
    """dense (batching on), dense_nobatch, identity (the near-identity model, no batching), json_sum."""
    model = folder / "dense" / "1" / "model.onnx"
    build_dense_onnx(model, width=WIDTH, layers=LAYERS)
    (folder / "dense" / "config.pbtxt").write_text(
        DENSE_CONFIG.format(max_batch=MAX_BATCH, width=WIDTH, batching=BATCHING))
    (folder / "dense_nobatch" / "1").mkdir(parents=True)
    os.link(model, folder / "dense_nobatch" / "1" / "model.onnx")
    (folder / "dense_nobatch" / "config.pbtxt").write_text(
        DENSE_CONFIG.format(max_batch=MAX_BATCH, width=WIDTH, batching=""))
    build_identity_onnx(folder / "identity" / "1" / "model.onnx")
    (folder / "identity" / "config.pbtxt").write_text(
        DENSE_CONFIG.format(max_batch=MAX_BATCH, width=IDENTITY_WIDTH, batching=""))
    (folder / "json_sum" / "1").mkdir(parents=True)
    (folder / "json_sum" / "config.pbtxt").write_text(JSON_SUM_CONFIG)
    (folder / "json_sum" / "1" / "model.py").write_text(JSON_SUM)
    return folder


HEALTH_PROBE = """
import socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
connection = socket.create_connection(("127.0.0.1", port))
slowest, end = 0.0, time.monotonic() + seconds
while time.monotonic() < end:
    started = time.monotonic()
    connection.sendall(b"GET /v2/health/live HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    connection.recv(4096)
    slowest = max(slowest, time.monotonic() - started)
    time.sleep(0.01)
print(slowest)
"""


def json_memory(server: OurServer, copies: int = 4, elements: int = 3_000_000) -> dict:
    """Server peak RSS growth per MiB of JSON while ``copies`` large JSON requests arrive at once,
    and the slowest health answer meanwhile (asked from another process)."""
    import httpx
    import orjson

    values = np.random.default_rng(0).random(elements)
    body = orjson.dumps({"inputs": [{"name": "IN", "shape": [elements], "datatype": "FP32", "data": values}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    before = peak_rss(server.process.pid)
    probe = subprocess.Popen([sys.executable, "-c", HEALTH_PROBE, str(server.http_port), "5"],
                             stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    from concurrent.futures import ThreadPoolExecutor

    url = f"http://127.0.0.1:{server.http_port}/v2/models/json_sum/infer"
    with ThreadPoolExecutor(copies) as pool:
        statuses = [r.status_code for r in pool.map(lambda _: httpx.post(url, content=body, timeout=300),
                                                    range(copies))]
    growth = peak_rss(server.process.pid) - before
    slowest = float(probe.communicate(timeout=60)[0])
    mib = len(body) / 2**20
    return {"copies": copies, "json_mib_each": round(mib, 1), "statuses": statuses,
            "peak_rss_growth_mib": round(growth / 2**20),
            "peak_mib_per_json_mib": round(growth / (copies * len(body)), 2),
            "slowest_health_ms": round(slowest * 1000, 1)}


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def build_identity_onnx(path: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", IDENTITY_WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", IDENTITY_WIDTH])],
    )
    save_onnx(graph, path)


def server_session_options(config_text: str):
    """The SessionOptions our ONNX handler makes from ``config_text`` (threads, spinning, graph level): bare
    onnxruntime run with them differs from the server only by the serving."""
    import onnxruntime as ort

    from handlers.onnx.options import session_plan
    from runtime.config.pbtxt import parse_model_config

    spec = parse_model_config(config_text, "dense")
    return session_plan(ort, spec.proto, spec.parameters, False, 0).options


def bare_onnxruntime(model_path: Path, width: int, batch_sizes: list[int], seconds: float,
                     options=None) -> dict[int, dict]:
    """Samples per second of session.run in this process, one call at a time, per batch size, started on the
    servers' CPU (onnxruntime places its own intra-op threads, as it does in the server); ``options``: the
    session's, onnxruntime's defaults when None."""
    import onnxruntime as ort

    if PINNING:
        os.sched_setaffinity(0, {SERVER_CPU})
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
    result = {}
    for batch in batch_sizes:
        feeds = {"INPUT0": np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)}
        for _ in range(5):
            session.run(None, feeds)
        latencies = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            session.run(None, feeds)
            latencies.append(time.perf_counter() - start)
        result[batch] = {"throughput": batch * len(latencies) / sum(latencies),
                         "p50_ms": statistics.median(latencies) * 1e3}
    return result


async def drive(infer, concurrency: int, seconds: float, warmup: float) -> tuple[list[float], int, float]:
    """Run ``concurrency`` request loops; returns latencies, error count and measured seconds."""
    latencies: list[float] = []
    errors = 0
    measuring = False

    async def loop(end: float) -> None:
        nonlocal errors
        while time.perf_counter() < end:
            start = time.perf_counter()
            try:
                await infer()
            except Exception:  # noqa: BLE001 - counted and reported
                errors += 1
                continue
            if measuring:
                latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(loop(time.perf_counter() + warmup) for _ in range(concurrency)))
    measuring = True
    started = time.perf_counter()
    await asyncio.gather(*(loop(started + seconds) for _ in range(concurrency)))
    return latencies, errors, time.perf_counter() - started


def client_for(protocol: str, url: str):
    if protocol == "grpc":
        import tritonclient.grpc.aio as module
    else:
        import tritonclient.http.aio as module
    return module, module.InferenceServerClient(url) if protocol == "grpc" else module.InferenceServerClient(
        url, conn_limit=256)


async def measure(target: str, url: str, protocol: str, model: str, width: int, concurrency: int,
                  seconds: float, warmup: float, binary: bool = True, headers: dict | None = None,
                  rows: int = 1) -> Point:
    """``concurrency`` loops of ``rows``-sample requests; throughput counts samples."""
    module, client = client_for(protocol, url)
    data = np.random.default_rng(concurrency).standard_normal((rows, width)).astype(np.float32)
    tensor = module.InferInput("INPUT0", [rows, width], "FP32")
    if protocol == "grpc":
        tensor.set_data_from_numpy(data)
        outputs = [module.InferRequestedOutput("OUTPUT0")]
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
        outputs = [module.InferRequestedOutput("OUTPUT0", binary_data=binary)]

    async def infer() -> None:
        await client.infer(model, [tensor], outputs=outputs, headers=headers)

    try:
        latencies, errors, elapsed = await drive(infer, concurrency, seconds, warmup)
    finally:
        await client.close()
    latencies.sort()
    count = len(latencies)
    return Point(target, model if rows == 1 else f"{model}[b{rows}]", protocol, concurrency, count, elapsed,
                 rows * count / elapsed,
                 latencies[count // 2] * 1e3 if count else float("nan"),
                 latencies[min(count - 1, int(count * 0.99))] * 1e3 if count else float("nan"), errors)


def executed_batch(http_url: str, model: str, before: dict | None) -> tuple[float | None, dict]:
    import httpx

    stats = httpx.get(f"http://{http_url}/v2/models/{model}/stats").json()["model_stats"][0]
    if before is None:
        return None, stats
    inferences = stats["inference_count"] - before["inference_count"]
    executions = stats["execution_count"] - before["execution_count"]
    return (inferences / executions if executions else None), stats


class OurServer:
    def __init__(self, repository: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log = open(repository.parent / "server.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [*pinned(SERVER_CPU), sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
             "--host", "127.0.0.1", "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
             "--no-metrics", "--device", "cpu", "--log-level", "WARNING"],
            cwd=ROOT, stdout=self.log, stderr=self.log)
        wait_http(f"http://127.0.0.1:{self.http_port}/v2/health/ready", process=self.process)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.log.close()


class EchoServer:
    """The floor for any Python gRPC server: ModelInfer echoing its input, no validation, no model.

    Same grpcio stack and message classes as ours; the near-identity model's overhead is
    measured against it (same client, same machine, same run)."""

    def __init__(self) -> None:
        self.grpc_port = free_port()
        self.process = subprocess.Popen([*pinned(SERVER_CPU), sys.executable, "-m", "scripts.benchmark",
                                         "--echo-server", str(self.grpc_port)], cwd=ROOT)
        wait_grpc_live(self.grpc_port, self.process, timeout=30)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def serve_echo(port: int, stack: str = "aio") -> None:
    """The echo server on grpc.aio (uvloop), grpcio's thread-pool server (``threads``: as many threads as ours has
    for ModelInfer) or the native edge (``native``: runtime/grpc/_native_edge, events taken on a uvloop loop): the
    floor of each stack the server can run on."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def live(request, context):
        return service_pb2.ServerLiveResponse(live=True)

    def infer(request, context):
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            response.outputs.add(name="OUTPUT0", datatype=tensor.datatype, shape=tensor.shape)
            response.raw_output_contents.append(raw)
        return response

    if stack == "native":
        serve_native_echo(port, live, infer)
        return
    if stack == "threads":
        from concurrent.futures import ThreadPoolExecutor

        class ThreadEcho(service_pb2_grpc.GRPCInferenceServiceServicer):
            ServerLive = staticmethod(live)
            ModelInfer = staticmethod(infer)

        from runtime.grpc.limits import GrpcLimits

        server = grpc.server(ThreadPoolExecutor(GrpcLimits().infer_threads))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(ThreadEcho(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return

    class Echo(service_pb2_grpc.GRPCInferenceServiceServicer):
        async def ServerLive(self, request, context):
            return live(request, context)

        async def ModelInfer(self, request, context):
            return infer(request, context)

    async def run() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


def serve_native_echo(port: int, live: Callable, infer: Callable) -> None:
    """The echo on the native edge: each batch of calls taken, decoded, answered in place on the loop."""
    import importlib

    from tritonclient.grpc import service_pb2

    native = importlib.import_module("runtime.grpc._native_edge")
    answers = {"/inference.GRPCInferenceService/ModelInfer": (service_pb2.ModelInferRequest, infer),
               "/inference.GRPCInferenceService/ServerLive": (service_pb2.ServerLiveRequest, live)}

    async def run() -> None:
        edge = native.Edge(f"127.0.0.1:{port}", [])

        def take() -> None:
            for call, kind, payload in edge.take():
                if kind == native.START:
                    request_type, answer = answers[call.method]
                    call.finish(0, "", answer(request_type.FromString(payload), None).SerializeToString())

        asyncio.get_running_loop().add_reader(edge.fileno(), take)
        await asyncio.Event().wait()

    import uvloop

    uvloop.run(run())


MLSERVER_MODEL = '''
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        self.session = ort.InferenceSession(self.settings.parameters.uri, providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i).astype(np.float32) for i in payload.inputs}
        (output,) = self.session.run(["OUTPUT0"], feeds)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", output)])
'''


class MLServer:
    """MLServer in its own venv (created once under .bench/), serving the same dense ONNX file."""

    def __init__(self, model_path: Path, workdir: Path, adaptive_batching: bool) -> None:
        venv = ROOT / ".bench" / f"mlserver-{MLSERVER_VERSION}"
        if not (venv / "bin" / "mlserver").exists():
            print(f"installing mlserver=={MLSERVER_VERSION} into {venv} ...", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"mlserver=={MLSERVER_VERSION}",
                            "uvloop<0.22", "onnxruntime", "numpy<2.3"], check=True)
        folder = workdir / ("mlserver-batched" if adaptive_batching else "mlserver")
        (folder / "dense").mkdir(parents=True, exist_ok=True)
        (folder / "onnx_model.py").write_text(textwrap.dedent(MLSERVER_MODEL))
        self.http_port, self.grpc_port = free_port(), free_port()
        (folder / "settings.json").write_text(json.dumps({
            "http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": free_port(),
            "parallel_workers": 0, "debug": False,
        }))
        model_settings = {"name": "dense", "implementation": "onnx_model.OnnxModel",
                          "parameters": {"uri": str(model_path)}}
        if adaptive_batching:
            model_settings |= {"max_batch_size": MAX_BATCH, "max_batch_time": 0.002}
        (folder / "dense" / "model-settings.json").write_text(json.dumps(model_settings))
        self.log = open(folder / "mlserver.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen([*pinned(SERVER_CPU), str(venv / "bin" / "mlserver"), "start", str(folder)],
                                        cwd=folder,
                                        stdout=self.log, stderr=self.log, start_new_session=True)
        wait_http(f"http://127.0.0.1:{self.http_port}/v2/models/dense/ready", process=self.process)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def print_point(point: Point, bare: float | None = None) -> None:
    ratio = f"  x{point.throughput / bare:.2f} of bare ORT" if bare else ""
    batch = f"  mean batch {point.mean_executed_batch:.1f}" if point.mean_executed_batch else ""
    errors = f"  errors {point.errors}" if point.errors else ""
    print(f"  {point.target:10} {point.protocol:4} {point.model:14} c={point.concurrency:<3} "
          f"{point.throughput:9.1f}/s  p50 {point.p50_ms:7.2f} ms  p99 {point.p99_ms:7.2f} ms{batch}{ratio}{errors}",
          flush=True)


async def run_ours(server: OurServer, results: Results, seconds: float, warmup: float,
                   concurrency: tuple[int, ...]) -> None:
    grpc_url, http_url = f"127.0.0.1:{server.grpc_port}", f"127.0.0.1:{server.http_port}"
    bare = results.bare_onnxruntime["dense"]
    for protocol, url in (("grpc", grpc_url), ("http", http_url)):
        for model in ("dense", "dense_nobatch"):
            for c in concurrency:
                _, before = executed_batch(http_url, model, None)
                point = await measure("ours", url, protocol, model, WIDTH, c, seconds, warmup)
                point.mean_executed_batch, _ = executed_batch(http_url, model, before)
                results.points.append(point)
                print_point(point, bare[1]["throughput"])
    for c in (1, 4, 16):  # requests of batch 8: per-request overhead amortised over 8 samples
        _, before = executed_batch(http_url, "dense", None)
        point = await measure("ours", grpc_url, "grpc", "dense", WIDTH, c, seconds, warmup, rows=REQUEST_BATCH)
        point.mean_executed_batch, _ = executed_batch(http_url, "dense", before)
        results.points.append(point)
        print_point(point, bare[REQUEST_BATCH]["throughput"])
    for c in (1, 8, 64):  # over gRPC: in turns with the echo server (identity_against_echo)
        point = await measure("ours", http_url, "http", "identity", IDENTITY_WIDTH, c, seconds, warmup)
        results.points.append(point)
        print_point(point)


IDENTITY_ROUNDS = 3


async def identity_against_echo(server: OurServer, echo: EchoServer, results: Results, seconds: float,
                                warmup: float) -> dict:
    """The near-identity model over gRPC against the echo server, both up at once, in turns point by point, the
    order reversed every round, so that each pair is measured seconds apart: the median (and range) of the paired
    p50 differences at c=1 and of the paired rate ratios."""
    targets = {"echo": f"127.0.0.1:{echo.grpc_port}", "ours": f"127.0.0.1:{server.grpc_port}"}
    differences: list[float] = []
    rates: dict[int, list[float]] = {1: [], 8: [], 64: []}
    for round_index in range(IDENTITY_ROUNDS):
        order = ["echo", "ours"] if round_index % 2 == 0 else ["ours", "echo"]
        for c in rates:
            pair = {}
            for name in order:
                pair[name] = await measure(name, targets[name], "grpc", "identity", IDENTITY_WIDTH, c, seconds,
                                           warmup)
                results.points.append(pair[name])
                print_point(pair[name])
            rates[c].append(pair["ours"].throughput / pair["echo"].throughput)
            if c == 1:
                differences.append((pair["ours"].p50_ms - pair["echo"].p50_ms) * 1e3)
    return {"p50_overhead_us_at_c1": statistics.median(differences),
            "p50_overhead_us_at_c1_range": [min(differences), max(differences)],
            "throughput_vs_echo": {f"grpc@{c}": statistics.median(values) for c, values in rates.items()}}


def find(results: Results, target: str, model: str, protocol: str, concurrency: int) -> Point | None:
    return next((p for p in results.points if (p.target, p.model, p.protocol, p.concurrency)
                 == (target, model, protocol, concurrency)), None)


def summarize(results: Results, concurrency: tuple[int, ...]) -> None:
    bare = results.bare_onnxruntime["dense"]
    ratios: dict = {"vs_bare_same_request_batch": {}, "vs_bare_same_executed_batch": {},
                    "vs_bare_ort_defaults_same_executed_batch": {}, "batching_on_vs_off": {}, "vs_mlserver": {}}
    for protocol in ("grpc", "http"):
        for c in concurrency:
            on = find(results, "ours", "dense", protocol, c)
            off = find(results, "ours", "dense_nobatch", protocol, c)
            if on is None or off is None:
                continue
            key = f"{protocol}@{c}"
            ratios["vs_bare_same_request_batch"][key] = on.throughput / bare[1]["throughput"]
            if on.mean_executed_batch:
                nearest = min(bare, key=lambda b: abs(b - on.mean_executed_batch))
                ratios["vs_bare_same_executed_batch"][key] = on.throughput / bare[nearest]["throughput"]
                ratios["vs_bare_ort_defaults_same_executed_batch"][key] = (
                    on.throughput / results.bare_onnxruntime["dense_ort_defaults"][nearest]["throughput"])
            ratios["batching_on_vs_off"][key] = on.throughput / off.throughput
            for suffix, ml_target in (("", "mlserver"), ("_both_batching", "mlserver+b")):
                peer = find(results, ml_target, "dense", protocol, c)
                if peer and peer.throughput:
                    ratios["vs_mlserver"][key + suffix] = on.throughput / peer.throughput
    for c in (1, 4, 16):
        point = find(results, "ours", f"dense[b{REQUEST_BATCH}]", "grpc", c)
        if point:
            ratios["vs_bare_same_request_batch"][f"grpc@{c}[b{REQUEST_BATCH}]"] = (
                point.throughput / bare[REQUEST_BATCH]["throughput"])
            if point.mean_executed_batch:
                nearest = min(bare, key=lambda b: abs(b - point.mean_executed_batch))
                ratios["vs_bare_same_executed_batch"][f"grpc@{c}[b{REQUEST_BATCH}]"] = (
                    point.throughput / bare[nearest]["throughput"])
    identity = find(results, "ours", "identity", "grpc", 1)
    bare_identity = results.bare_onnxruntime["identity"][1]["p50_ms"]
    if identity:
        ratios["identity_grpc_p50_us_at_c1_minus_bare_onnxruntime"] = (identity.p50_ms - bare_identity) * 1e3
    if results.identity_vs_echo:
        ratios["identity_grpc_p50_overhead_us_at_c1"] = results.identity_vs_echo["p50_overhead_us_at_c1"]
        ratios["identity_grpc_throughput_vs_echo"] = results.identity_vs_echo["throughput_vs_echo"]
    results.ratios = ratios
    grpc32 = ratios["vs_bare_same_executed_batch"].get("grpc@32")
    ml32 = ratios["vs_mlserver"].get("grpc@32_both_batching") or ratios["vs_mlserver"].get("grpc@32")
    overhead = ratios.get("identity_grpc_p50_overhead_us_at_c1")
    results.targets = {
        "MLP served / bare onnxruntime at the mean executed batch size, gRPC c=32": target(grpc32, ">=", 0.8),
        "MLP throughput / MLServer at c=32 (gRPC)": target(ml32, ">=", 2.0),
        "near-identity p50 over gRPC at c=1 minus the echo server's, us": target(overhead, "<", 300.0),
    }
    print("\nratios")
    for name, values in ratios.items():
        if isinstance(values, dict):
            print(f"  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
        else:
            print(f"  {name}: {values:.0f}")


RELATIONS = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def target(value: float | None, relation: str, goal: float) -> dict:
    """One target: the measured value (None when not measured), the relation it must hold to the goal, met."""
    met = None if value is None else RELATIONS[relation](value, goal)
    return {"value": value, "relation": relation, "goal": goal, "met": met}


def collect_targets(results: Results) -> None:
    """Adds the side-by-side and across-cores targets to ``results.targets`` (the issue's whole list, one run)."""
    for what, value, relation, goal, _ in triton_targets(results.vs_triton):
        results.targets[what] = target(value, relation, goal)
    for row in results.across_cores:
        if row["target"]:
            results.targets[f"{row['protocol']} add_sub_batch, {row['frontends']} front ends on {row['cores']} cores "
                            f"/ one process on 1 core"] = target(row["scaling"], ">=", row["target"])


def print_targets(results: Results) -> None:
    print("\ntargets (this run)")
    for name, row in results.targets.items():
        if row["value"] is None:
            print(f"  {name}: not measured (target {row['relation']} {row['goal']:g})")
            continue
        print(f"  {name}: {row['value']:.2f} (target {row['relation']} {row['goal']:g}: "
              f"{'met' if row['met'] else 'NOT met'})")


async def main_async(args: argparse.Namespace) -> Results:
    seconds, warmup = (1.0, 0.3) if args.quick else (3.0, 1.0)
    concurrency = (1, 4, 16, 32, 64) if args.quick else CONCURRENCY
    results = Results(machine={"python": platform.python_version(), "cpus": os.cpu_count(),
                               "machine": platform.machine()})
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        repository = build_repository(workdir / "models")
        print(f"bare onnxruntime (in process, on CPU {SERVER_CPU} as the servers), {WIDTH}x{WIDTH} x{LAYERS} MLP",
              flush=True)
        dense_model, sizes = repository / "dense" / "1" / "model.onnx", [1, 2, 4, 8, 16, 32, 64]
        results.bare_onnxruntime["dense"] = bare_onnxruntime(dense_model, WIDTH, sizes, seconds,
                                                             server_session_options(DENSE_CONFIG.format(
                                                                 max_batch=MAX_BATCH, width=WIDTH, batching="")))
        results.bare_onnxruntime["dense_ort_defaults"] = bare_onnxruntime(dense_model, WIDTH, sizes, seconds)
        results.bare_onnxruntime["identity"] = bare_onnxruntime(repository / "identity" / "1" / "model.onnx",
                                                                IDENTITY_WIDTH, [1], seconds)
        defaults = results.bare_onnxruntime["dense_ort_defaults"]
        print("  with the server's session options (no spinning threads); onnxruntime's defaults (spinning) after")
        for batch, row in results.bare_onnxruntime["dense"].items():
            print(f"  batch {batch:3}: {row['throughput']:9.1f} samples/s  p50 {row['p50_ms']:.2f} ms    "
                  f"{defaults[batch]['throughput']:9.1f} samples/s  p50 {defaults[batch]['p50_ms']:.2f} ms")
        print(f"  identity batch 1: p50 {results.bare_onnxruntime['identity'][1]['p50_ms'] * 1e3:.0f} us")
        pin_client()
        print("\nour server", flush=True)
        server = OurServer(repository)
        echo = EchoServer()
        try:
            await run_ours(server, results, seconds, warmup, concurrency)
            print("\nthe near-identity model over gRPC in turns with the echo server (the floor: same client and "
                  "grpc stack, no model, no validation)", flush=True)
            results.identity_vs_echo = await identity_against_echo(server, echo, results, seconds, warmup)
            print("\nlarge JSON tensors: 4 requests of ~55 MiB of JSON at once", flush=True)
            results.json_memory = json_memory(server)
            print("  " + ", ".join(f"{k} {v}" for k, v in results.json_memory.items()))
        finally:
            echo.stop()
            server.stop()
        if not args.skip_mlserver:
            for batched, target in ((False, "mlserver"), (True, "mlserver+b")):
                print(f"\nMLServer {MLSERVER_VERSION} ({'adaptive batching' if batched else 'no batching'})",
                      flush=True)
                try:
                    peer = MLServer(repository / "dense" / "1" / "model.onnx", workdir, batched)
                except (subprocess.CalledProcessError, RuntimeError, TimeoutError) as exc:
                    print(f"  MLServer unavailable: {exc}")
                    break
                json_headers = {"Content-Type": "application/json"}
                try:
                    for c in (1, 8, 32):
                        for protocol, url in (("grpc", f"127.0.0.1:{peer.grpc_port}"),
                                              ("http", f"127.0.0.1:{peer.http_port}")):
                            # MLServer reads JSON only when told so (aiohttp sends octet-stream by default)
                            point = await measure(target, url, protocol, "dense", WIDTH, c, seconds, warmup,
                                                  binary=False, headers=json_headers if protocol == "http" else None)
                            results.points.append(point)
                            print_point(point)
                finally:
                    peer.stop()
        if not args.skip_triton:
            print("\nside by side with real Triton 2.51 (Python backend; each server on CPU 0, client on CPU 1)",
                  flush=True)
            results.vs_triton = summarize_vs_triton(side_by_side(requests=600 if args.quick else 3000,
                                                                 runs=1 if args.quick else 3))
        if not args.skip_frontends and frontends_available():
            print("\nacross cores: front-end processes (h2load; gRPC and HTTP)", flush=True)
            unpin()
            for protocol in ("grpc", "http"):
                results.across_cores += scaling(4, 8000 if args.quick else 40000, protocol)
        summarize(results, concurrency)
        if results.vs_triton:
            print_summary(results.vs_triton)
        for protocol in ("grpc", "http"):
            rows = [row for row in results.across_cores if row["protocol"] == protocol]
            if rows:
                print_scaling(rows, 8000 if args.quick else 40000)
        collect_targets(results)
        print_targets(results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter points and fewer concurrencies")
    parser.add_argument("--skip-mlserver", action="store_true", help="do not install or run MLServer")
    parser.add_argument("--skip-triton", action="store_true", help="do not run the side by side with real Triton")
    parser.add_argument("--skip-frontends", action="store_true", help="do not measure front-end processes")
    parser.add_argument("--output", type=Path, default=ROOT / "bench_results.json")
    parser.add_argument("--echo-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--echo-stack", choices=["aio", "threads", "native"], default="aio", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        serve_echo(args.echo_server, args.echo_stack)
        return
    results = asyncio.run(main_async(args))
    args.output.write_text(json.dumps(asdict(results), indent=2))
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
