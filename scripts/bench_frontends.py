"""Across cores: the tiny Python model (bench_vs_triton's add_sub_batch, dynamic batching) served by one process on
one core, then by front-end processes (``--frontend-processes k``) on k cores, under h2load's load.

h2load (nghttp2's C load generator) is the client: it costs about 40 µs of CPU per request where tritonclient
costs several hundred, so on a small machine it can share the server's cores without deciding the result. Each
row prints the rate, the server's CPU per request split by role (the process owning the models, the front ends,
the Python model's worker) and the client's; the scaling ratio is against the one-process, one-core rate of the
same run, with the issue's target of 0.7·k. The process owning the models handles every request once, so
1 / (its CPU per request) bounds the rate any number of front ends reaches: printed as the ceiling.

Every call is counted: h2load counts an HTTP 200 as a success, and a gRPC error arrives inside one (its status in
the trailers, which h2load does not read), so the good answers are the model's successful inferences in the
server's statistics over the run; any request short of them is a bad call, the row is marked FAILED and the script
exits 1.

    .venv/bin/python -m scripts.bench_frontends [--cores 4] [--requests 40000] [--protocol grpc|http]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from scripts.bench_models import ADD_SUB, ADD_SUB_CONFIG, OUTPUTS, SHAPES
from scripts.bench_servers import wait_ready
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]

# 128 requests in flight: gRPC as 16 connections of 8 streams, HTTP/1.1 as 128 connections (connections are spread
# over the front ends by the kernel, SO_REUSEPORT, so a single one would reach a single front end)
CONNECTIONS = {"grpc": 16, "http": 128}
STREAMS = {"grpc": 8, "http": 1}


def build_repository(root: Path) -> Path:
    (root / "add_sub_batch" / "1").mkdir(parents=True)
    (root / "add_sub_batch" / "1" / "model.py").write_text(textwrap.dedent(ADD_SUB).lstrip())
    (root / "add_sub_batch" / "config.pbtxt").write_text(textwrap.dedent(ADD_SUB_CONFIG).lstrip())
    return root


def request_files(workdir: Path, model: str = "add_sub_batch") -> dict[str, tuple[Path, list[str]]]:
    """One request for ``model`` (one of bench_vs_triton's, its inputs' shapes) as gRPC's framed message and as an
    HTTP binary-tensor body asking for binary outputs, as bench_vs_triton's client sends them, with its headers
    (written into ``workdir``, replacing the last ones)."""
    from tritonclient.grpc import service_pb2
    from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

    shapes = SHAPES[model]
    values = [np.arange(np.prod(shape), dtype=np.float32).reshape(shape) for _, shape in shapes]
    message = service_pb2.ModelInferRequest(model_name=model)
    for (name, shape), value in zip(shapes, values, strict=True):
        tensor = message.inputs.add(name=name, datatype="FP32", shape=shape)
        del tensor  # contents travel in raw_input_contents, as tritonclient sends them
        message.raw_input_contents.append(value.tobytes())
    serialized = message.SerializeToString()
    grpc_file = workdir / "request.grpc"
    grpc_file.write_bytes(b"\0" + struct.pack(">I", len(serialized)) + serialized)
    inputs = [InferInput(name, shape, "FP32").set_data_from_numpy(value)
              for (name, shape), value in zip(shapes, values, strict=True)]
    requested = [InferRequestedOutput(name, binary_data=True) for name in OUTPUTS[model]]  # as bench_vs_triton asks
    body, json_size = InferenceServerClient.generate_request_body(inputs, outputs=requested)
    http_file = workdir / "request.http"
    http_file.write_bytes(body)
    return {"grpc": (grpc_file, ["content-type: application/grpc", "te: trailers"]),
            "http": (http_file, ["content-type: application/octet-stream",
                                 f"inference-header-content-length: {json_size}"])}


def start(repository: Path, cpus: list[int], frontends: int, log: Path) -> tuple[subprocess.Popen, int, int]:
    http, grpc = free_port(), free_port()
    command = ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-m", "bootstrap.cli", "run",
               "--model-repository", str(repository), "--host", "127.0.0.1", "--http-port", str(http),
               "--grpc-port", str(grpc), "--no-metrics", "--device", "cpu", "--frontend-processes", str(frontends)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_ready(process, http, timeout=120)
    return process, http, grpc


def cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds so far of the process owning the models, its front ends and its model workers."""
    def seconds(process: psutil.Process) -> float:
        try:
            times = process.cpu_times()
            return times.user + times.system
        except psutil.NoSuchProcess:
            return 0.0

    root = psutil.Process(pid)
    roles = {"owner": seconds(root), "frontends": 0.0, "workers": 0.0}
    for child in root.children(recursive=True):
        try:
            role = "frontends" if "runtime.frontends.process" in " ".join(child.cmdline()) else "workers"
        except psutil.NoSuchProcess:
            continue
        roles[role] += seconds(child)
    return roles


def h2load(protocol: str, port: int, files: dict, client_cpus: list[int], requests: int) -> tuple[float, float, str]:
    """Requests/s, the client's CPU µs per request, and h2load's status line."""
    path, headers = files[protocol]
    url = (f"http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer" if protocol == "grpc"
           else f"http://127.0.0.1:{port}/v2/models/add_sub_batch/infer")
    command = ["taskset", "-c", ",".join(map(str, client_cpus)), "h2load", "-n", str(requests), "-c",
               str(CONNECTIONS[protocol]), "-m", str(STREAMS[protocol]), "-d", str(path),
               *(part for header in headers for part in ("-H", header)), url]
    if protocol == "http":
        command[command.index("h2load") + 1:command.index("h2load") + 1] = ["--h1"]
    before = os.times()
    began = time.perf_counter()
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - began
    after = os.times()
    client = (after.children_user - before.children_user + after.children_system - before.children_system)
    status = next((line.strip() for line in output.splitlines() if line.strip().startswith("status codes")), "")
    return requests / elapsed, client / requests * 1e6, status


def successful_inferences(http_port: int, model: str = "add_sub_batch") -> int:
    """The requests ``model`` has answered successfully, from the server's statistics (a gRPC call that h2load
    counts as done whatever its grpc-status is counted here only if it succeeded)."""
    stats = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/{model}/stats", timeout=30).json()["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def measure(repository: Path, files: dict, protocol: str, cpus: list[int], client_cpus: list[int], frontends: int,
            requests: int, workdir: Path) -> dict:
    process, http, grpc = start(repository, cpus, frontends, workdir / f"server-{len(cpus)}-{frontends}.log")
    try:
        port = grpc if protocol == "grpc" else http
        h2load(protocol, port, files, client_cpus, min(5000, requests))  # warm-up
        succeeded = successful_inferences(http)
        before = cpu_by_role(process.pid)
        rate, client_us, status = h2load(protocol, port, files, client_cpus, requests)
        after = cpu_by_role(process.pid)
        good = successful_inferences(http) - succeeded
    finally:
        process.terminate()
        process.wait(60)
    us = {role: (after[role] - before[role]) / max(good, 1) * 1e6 for role in after}
    return {"cores": len(cpus), "frontends": frontends, "rate": rate * good / requests, "cpu_us": us,
            "client_us": client_us, "status": status, "bad_calls": requests - good,
            "client_shares": bool(set(client_cpus) & set(cpus))}


def scaling(max_cores: int = 4, requests: int = 40000, protocol: str = "grpc") -> list[dict]:
    """The one-process, one-core baseline, then k front ends on k cores for k = 1 .. max_cores (as the machine
    allows); one dict per row."""
    available = sorted(os.sched_getaffinity(0))
    workdir = Path(tempfile.mkdtemp(prefix="bench-frontends-"))
    try:
        repository = build_repository(workdir / "repo")
        files = request_files(workdir)
        client = available[1:2] or available[:1]  # the baseline's client on another core when there is one
        rows = [measure(repository, files, protocol, available[:1], client, 0, requests, workdir)]
        for cores in range(1, min(max_cores, len(available)) + 1):
            server = available[:cores]
            client = available[cores:cores + 2] or server  # on a small machine the client shares the server's cores
            rows.append(measure(repository, files, protocol, server, client, cores, requests, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for row in rows:
        row["scaling"] = row["rate"] / rows[0]["rate"]
        row["target"] = 0.7 * row["cores"] if row["frontends"] and row["cores"] > 1 else None
        row["ceiling"] = 1e6 / row["cpu_us"]["owner"] if row["frontends"] and row["cpu_us"]["owner"] else None
        row["protocol"] = protocol
    return rows


def print_scaling(rows: list[dict], requests: int) -> None:
    protocol = rows[0]["protocol"]
    print(f"\nadd_sub_batch over {protocol}, {CONNECTIONS[protocol]} connections x {STREAMS[protocol]} in flight, "
          f"{requests} requests, h2load")
    print(f"{'server':32} {'req/s':>7} {'x 1-core':>8} {'target':>7}  CPU us/req: owner front-ends workers "
          f"client   ceiling")
    for row in rows:
        us = row["cpu_us"]
        serving = f"{row['frontends']} front end(s)" if row["frontends"] else "one process"
        label = f"{row['cores']} core(s), {serving}"
        label += " *" if row["client_shares"] else ""
        target = f"{row['target']:.1f}x" if row["target"] else ""
        ceiling = f"{row['ceiling']:7.0f}" if row["ceiling"] else "       "
        failed = f"  FAILED: {row['bad_calls']} bad calls ({row['status']})" if row["bad_calls"] else ""
        print(f"{label:32} {row['rate']:7.0f} {row['scaling']:7.2f}x {target:>7}  {us['owner']:21.0f} "
              f"{us['frontends']:10.0f} {us['workers']:7.0f} {row['client_us']:6.0f}   {ceiling}{failed}")
    print("* the client (h2load) shares the server's cores: its CPU per request is in the client column; ceiling: "
          "1 / the owner's CPU per request, the most any number of front ends reaches")


def available() -> bool:
    return shutil.which("h2load") is not None and shutil.which("taskset") is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=4, help="the most cores to give the server")
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    args = parser.parse_args()
    if not available():
        print("needs h2load (apt install nghttp2-client) and taskset")
        return 2
    rows = scaling(args.cores, args.requests, args.protocol)
    print_scaling(rows, args.requests)
    print(json.dumps(rows))
    return 1 if any(row["bad_calls"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
