"""CPU per HTTP infer request of our ASGI application alone: no listener, no sockets, no client in the process's time.

    .venv/bin/python -m scripts.bench_http_app [--model add_sub_onnx] [--requests 20000] [--concurrency 32]
    .venv/bin/python -m scripts.bench_http_app --profile      # the same under cProfile, by own time
    taskset -c 0,1 ... --profile --worker-cpu 1               # a Python model's worker on CPU 1
    PROFILE_ROWS=60 PROFILE_SORT=ncalls PROFILE_CALLERS=get_running_loop ... --profile   # more rows, another
                                                               # order, who calls a function

Drives ``create_http_app`` with ASGI messages (tritonclient's binary request for the model, binary outputs asked
for as the benchmark's client asks, the answer discarded) on uvloop, ``--concurrency`` requests at a time, and
prints this process's CPU per request: the adapter, the core and the model, without granian's share (a Python
model's worker processes apart).  Run it pinned (``taskset -c 0``) and alternate trees to compare two versions of
the code: over a real listener the same change hides in ±20% of noise on this VM, here it shows within a few
percent.  Python-backend models (``--model add_sub_batch``) start their worker as the server does.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def measure(model: str, requests: int, concurrency: int, profile: bool, worker_cpu: int | None) -> None:
    from runtime.adapter_settings import AdapterSettings
    from runtime.http.app import create_http_app
    from runtime.server import Server, ServerOptions
    from scripts.bench_frontends import request_files
    from scripts.bench_models import build_repository

    work = Path(tempfile.mkdtemp(prefix="bench-http-app-"))
    repository = build_repository(work / "repo", "ours")
    body_file, header_lines = request_files(work, model)["http"]
    body = body_file.read_bytes()
    headers = [(b"host", b"bench"), (b"content-length", str(len(body)).encode())]
    headers += [tuple(part.strip().lower().encode() for part in line.split(":", 1)) for line in header_lines]
    from handlers import handler_class
    from handlers.auto_complete import complete_config

    server = Server(ServerOptions(model_repository=repository, adapters=AdapterSettings(http_port=None, grpc_port=None),
                                  metrics_port=None, use_gpu=False, handlers=handler_class, completer=complete_config))
    await server.service.load_initial_models()
    if worker_cpu is not None:
        # the Python worker on a CPU of its own: a write that wakes it then costs its own wall time, not the
        # worker's run (what a profile by wall time would charge it)
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.cpu_affinity([worker_cpu])
        psutil.Process().cpu_affinity([cpu for cpu in psutil.Process().cpu_affinity() if cpu != worker_cpu][:1])
    app = create_http_app(server.service)
    path = f"/v2/models/{model}/infer"
    statuses: dict[int, int] = {}

    async def one() -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
        given = False
        gone = asyncio.get_running_loop().create_future()  # the client stays until its answer is sent

        async def receive() -> dict:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] = statuses.get(message["status"], 0) + 1

        await app(scope, receive, send)
        if not gone.done():
            gone.set_result(None)

    left = requests

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    for _ in range(max(1, 2000 // concurrency)):  # warm-up
        await asyncio.gather(*(one() for _ in range(concurrency)))
    # PROFILE_TIMER=cpu: by this thread's CPU time (a wake-up of the worker on the same CPU is not ours), at a
    # higher cost per call
    timer = time.thread_time if os.environ.get("PROFILE_TIMER") == "cpu" else time.perf_counter
    profiler = cProfile.Profile(timer) if profile else None
    if profiler:
        profiler.enable()
    cpu, wall, times, workers = time.process_time(), time.perf_counter(), os.times(), workers_cpu()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    cpu, wall, after = time.process_time() - cpu, time.perf_counter() - wall, os.times()
    kernel = (after.system - times.system) / requests * 1e6
    workers = (workers_cpu() - workers) / requests * 1e6
    if profiler:
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
        stats.print_stats(int(os.environ.get("PROFILE_ROWS", "30")))
        if os.environ.get("PROFILE_CALLERS"):
            stats.print_callers(os.environ["PROFILE_CALLERS"])
    print(f"{model} c={concurrency}: {cpu / requests * 1e6:.1f} us of CPU per request ({kernel:.1f} in the kernel), "
          f"{requests / wall:.0f} requests/s, statuses {statuses}; Python workers {workers:.1f} us", flush=True)
    os._exit(0)  # Python workers and executor threads end with the process


def workers_cpu() -> float:
    """CPU seconds so far of this process's children (a Python model's workers, under its forkserver)."""
    from scripts.bench_servers import tree_cpu_seconds

    own = os.times()
    return tree_cpu_seconds(os.getpid()) - own.user - own.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="add_sub_onnx")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--worker-cpu", type=int, help="run the model's Python worker on this CPU (profiles by wall "
                        "time: not the worker's run charged to the write that wakes it)")
    args = parser.parse_args()
    import uvloop

    uvloop.run(measure(args.model, args.requests, args.concurrency, args.profile, args.worker_cpu))


if __name__ == "__main__":
    main()
