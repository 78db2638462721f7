"""The servers ``scripts.bench_vs_triton`` measures, each pinned to CPU 0: real Triton 2.51 (the nvidia-pytriton
wheel's, prepared by scripts/triton_oracle.sh), ours, and the stacks' echo floors; started, awaited, and stopped with
every process under them, and their CPU time read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from scripts.bench_load import pinned
from tests.conformance.servers import prepare_oracle
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]


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
               log_name: str = "ours.log", single_port: bool = False) -> tuple[subprocess.Popen, int, int]:
    """Our server from the checkout at ``root`` (``env`` added to this process's environment): (its process, HTTP
    port, gRPC port), both the one port with ``single_port``."""
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    command = [*pinned(0), sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port),
               "--metrics-port", str(metrics), "--device", "cpu", "--single-port", "true" if single_port else "false"]
    log = open(workdir / log_name, "wb")  # noqa: SIM115
    return (subprocess.Popen(command, cwd=root, env={**os.environ, **(env or {})}, stdout=log, stderr=log), http,
            http if single_port else grpc_port)


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
