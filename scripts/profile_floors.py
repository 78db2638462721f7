"""Where a small request's CPU goes: each protocol's floor beside our server, CPU per request by thread.

    .venv/bin/python -m scripts.profile_floors            # needs h2load (apt install nghttp2-client) and taskset

Serves, one at a time on CPU 0, with h2load on CPU 1 and 128 requests in flight (gRPC: 16 connections x 8
streams; HTTP/1.1: 128 connections):

- the floors: the benchmark's echo server on the native gRPC edge (scripts/benchmark.py --echo-server), and a
  bare ASGI app that answers the body back under our own HTTP listener (granian, embedded as the server embeds it);
- our server with bench_vs_triton's models: ``add_sub_onnx`` and ``add_sub_batch`` (the tiny Python model), then
  ``resnet50_pt`` and ``identity_big`` (600 KB in; one request a batch) with fewer requests.

For each it prints requests/s, the server's CPU per request split into its main (event-loop) thread, its other
threads and its child processes (Python workers), the mean batch the model executed, and how often per request the
loop thread went to sleep and was woken (voluntary context switches). Our CPU per request
minus the floor's is what our own code costs on top of the protocol stack. Not a test: the numbers depend on the
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from scripts.bench_frontends import request_files
from scripts.bench_models import build_repository
from scripts.bench_servers import wait_ready
from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent

REQUESTS = {"add_sub_onnx": 60000, "add_sub_batch": 60000, "resnet50_pt": 6000, "identity_big": 10000}
LOAD = {"grpc": ["-c", "16", "-m", "8"], "http": ["--h1", "-c", "128", "-m", "1"]}


def serve_http_echo(port: int) -> None:
    """A bare ASGI app under our HTTP listener: reads the body, answers it back."""
    import uvloop

    from runtime.http.server import HttpServer

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        length = next((int(value) for key, value in scope["headers"] if key == b"content-length"), -1)
        body, more = b"", True
        while more and len(body) != length:  # as our infer route: complete at its declared length
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def run() -> None:
        server = HttpServer(app, "127.0.0.1", port)
        await server.start()
        await asyncio.Event().wait()

    uvloop.run(run())


def cpu_by_thread(pid: int) -> dict[str, float]:
    """CPU seconds so far: the server's main thread, its other threads, its child processes."""
    root = psutil.Process(pid)
    threads = root.threads()
    main = next((t.user_time + t.system_time for t in threads if t.id == pid), 0.0)
    others = sum(t.user_time + t.system_time for t in threads if t.id != pid)
    children = 0.0
    for child in root.children(recursive=True):
        try:
            times = child.cpu_times()
            children += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return {"main": main, "other threads": others, "children": children}


def main_thread_wakeups(pid: int) -> int:
    """How many times the main (event-loop) thread has gone to sleep and been woken so far."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s*(\d+)", status, re.M).group(1))


def profile(label: str, protocol: str, command: list[str], port: int, url_path: str, body: tuple[Path, list[str]],
            stats_url: str | None = None, ready_port: int | None = None, only: str = "",
            requests: int = REQUESTS["add_sub_batch"]) -> None:
    if only not in label:
        return
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(["taskset", "-c", "0", *command], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        if ready_port:
            wait_ready(server, ready_port)
        else:
            time.sleep(4)
        path, headers = body
        load = ["taskset", "-c", "1", "h2load", *LOAD[protocol], "-d", str(path),
                *(part for header in headers for part in ("-H", header)), f"http://127.0.0.1:{port}{url_path}"]
        subprocess.run([*load, "-n", str(requests // 10)], capture_output=True, check=True)  # warm-up
        before, began, woken = cpu_by_thread(server.pid), time.perf_counter(), main_thread_wakeups(server.pid)
        output = subprocess.run([*load, "-n", str(requests)], capture_output=True, text=True, check=True).stdout
        elapsed, after = time.perf_counter() - began, cpu_by_thread(server.pid)
        woken = (main_thread_wakeups(server.pid) - woken) / requests
        batch = ""
        if stats_url:
            stats = httpx.get(stats_url, trust_env=False).json()["model_stats"][0]
            batch = f"  mean batch {stats['inference_count'] / max(1, stats['execution_count']):.1f}"
        split = {part: (after[part] - before[part]) / requests * 1e6 for part in after}
        status = next((line.strip() for line in output.splitlines() if line.strip().startswith("status codes")), "")
        print(f"{label:34} {requests / elapsed:7.0f}/s  {sum(split.values()):6.0f} us/req  ("
              + ", ".join(f"{part} {value:.0f}" for part, value in split.items())
              + f"){batch}  loop wake-ups/req {woken:.2f}  [{status}]",
              flush=True)
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="profile only the rows whose label contains this text")
    only = parser.parse_args().only
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="profile-floors-") as workdir:
        folder = Path(workdir)
        repository = build_repository(folder / "repo", "ours")
        infer = "/inference.GRPCInferenceService/ModelInfer"
        port = free_port()
        profile("native edge echo (floor)", "grpc", [python, "-m", "scripts.benchmark", "--echo-server", str(port),
                                                     "--echo-stack", "native"],
                port, infer, request_files(folder)["grpc"], only=only)
        port = free_port()
        profile("granian ASGI echo (floor)", "http", [python, "-m", "scripts.profile_floors", "--http-echo",
                                                      str(port)], port,
                "/v2/models/add_sub_batch/infer", request_files(folder)["http"], only=only)
        for protocol in ("grpc", "http"):
            for model in REQUESTS:
                http, grpc = free_port(), free_port()
                command = [python, "-m", "bootstrap.cli", "run", "--model-repository", str(repository), "--host",
                           "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc), "--no-metrics",
                           "--device", "cpu"]
                profile(f"ours, {protocol} {model}", protocol, command, grpc if protocol == "grpc" else http,
                        infer if protocol == "grpc" else f"/v2/models/{model}/infer",
                        request_files(folder, model)[protocol],
                        stats_url=f"http://127.0.0.1:{http}/v2/models/{model}/stats", ready_port=http, only=only,
                        requests=REQUESTS[model])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http-echo":
        serve_http_echo(int(sys.argv[2]))
    else:
        os.environ.setdefault("NO_PROXY", "*")
        main()
