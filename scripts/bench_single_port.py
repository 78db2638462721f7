"""One port against two: add_sub_onnx over gRPC and HTTP at c=1 and c=32, our server in its two-port mode
(grpcio's server and granian) and with ``--single-port true`` (hypercorn carrying both), from one run.

    .venv/bin/python -m scripts.bench_single_port [--requests 3000]

The server and its workers run on CPU 0, the tritonclient load (``scripts.bench_vs_triton``'s) on CPU 1; each
point is the better of two rounds, the modes taking turns; printed as single-port / two-port ratios beside each
mode's server CPU per request.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.bench_vs_triton import build_repository, load, pinned, stop_tree, tree_cpu_seconds, wait_ready
from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "add_sub_onnx"


def start(repository: Path, single_port: bool, log: Path) -> tuple[subprocess.Popen, int, int]:
    http, grpc_port = free_port(), free_port()
    command = [*pinned(0), sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port), "--no-metrics",
               "--device", "cpu", "--single-port", "true" if single_port else "false"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return process, http, http if single_port else grpc_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-single-port-"))
    repository = build_repository(workdir / "repo", "ours")
    best: dict[tuple[str, str, int], tuple[float, float]] = {}
    for single_port in (False, True, False, True):
        process, http, grpc_port = start(repository, single_port, workdir / f"server-{single_port}.log")
        try:
            wait_ready(process, http)
            for protocol in ("grpc", "http"):
                for concurrency in (1, 32):
                    before = tree_cpu_seconds(process.pid)
                    result = load(protocol, grpc_port if protocol == "grpc" else http, MODEL, concurrency,
                                  args.requests)
                    cpu = (tree_cpu_seconds(process.pid) - before) / result["served"] * 1e6
                    key = ("single" if single_port else "two", protocol, concurrency)
                    if key not in best or result["rps"] > best[key][0]:
                        best[key] = (result["rps"], cpu)
        finally:
            stop_tree(process)
    print(f"{MODEL}, server on CPU 0, load on CPU 1, better of two rounds")
    print("| protocol, concurrency | two ports req/s | one port req/s | one / two | server CPU per request, "
          "two / one |")
    print("| --- | --- | --- | --- | --- |")
    for protocol in ("grpc", "http"):
        for concurrency in (1, 32):
            (two, two_cpu), (one, one_cpu) = best[("two", protocol, concurrency)], best[("single", protocol,
                                                                                         concurrency)]
            print(f"| {protocol}, {concurrency} | {two:.0f} | {one:.0f} | {one / two:.2f}x | "
                  f"{two_cpu:.0f} / {one_cpu:.0f} µs |")


if __name__ == "__main__":
    main()
