"""One port against two: each model over gRPC and HTTP at c=1 and c=32, our server in its two-port mode (the
native gRPC edge and granian) and with ``--single-port`` (``runtime/listen/``: the edge and HAProxy on the port).

    .venv/bin/python -m scripts.bench_single_port [--requests 3000] [--rounds 3] [--models add_sub_onnx ...]

The server and its workers run on CPU 0, the tritonclient load (``scripts.bench_load``) on CPU 1. Each round starts
each mode afresh and measures every point in it (the modes' order reversed every round); a ratio is one port / two
ports within a round, and the table gives the median over the rounds and the range. Every call is counted: a point
with a call that failed or was answered wrongly is marked FAILED and the script exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from scripts.bench_load import bad_calls, load
from scripts.bench_models import MODELS, build_repository, point_requests
from scripts.bench_servers import start_ours, stop_tree, tree_cpu_seconds, wait_ready

DEFAULT_MODELS = ["add_sub_onnx"]
Point = tuple[str, str, int]  # model, protocol, concurrency


def measure_mode(repository: Path, single_port: bool, points: list[Point], requests: int,
                 log: Path) -> dict[Point, dict]:
    """Every point against one mode, started afresh: the load's figures and the server's CPU per good answer."""
    process, http, grpc_port = start_ours(repository, log.parent, log_name=log.name, single_port=single_port)
    out = {}
    try:
        wait_ready(process, http)
        for model, protocol, concurrency in points:
            before = tree_cpu_seconds(process.pid)
            result = load(protocol, grpc_port if protocol == "grpc" else http, model, concurrency,
                          point_requests(model, requests, concurrency), repository)
            spent = tree_cpu_seconds(process.pid) - before
            result["cpu_us"] = spent / result["served"] * 1e6 if result["served"] else float("nan")
            out[(model, protocol, concurrency)] = result
            bad = f"  {bad_calls(result)} BAD CALLS: {result['first_problem']}" if bad_calls(result) else ""
            print(f"  {'one port' if single_port else 'two ports':9} {model:13} {protocol:4} c={concurrency:<3} "
                  f"{result['rps']:8.0f} req/s  server CPU {result['cpu_us']:.0f} us/req{bad}", flush=True)
    finally:
        stop_tree(process)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    points = [(model, protocol, concurrency) for model in args.models for protocol in args.protocols
              for concurrency in args.concurrency]
    workdir = Path(tempfile.mkdtemp(prefix="bench-single-port-"))
    repository = build_repository(workdir / "repo", "ours")
    rounds: list[dict[bool, dict]] = []
    for index in range(args.rounds):
        modes = (False, True) if index % 2 == 0 else (True, False)
        rounds.append({mode: measure_mode(repository, mode, points, args.requests, workdir / f"server-{mode}.log")
                       for mode in modes})
    print(f"\nServer on CPU 0, load on CPU 1; median of {args.rounds} rounds (range), each ratio within "
          "a round")
    print("| model, protocol, concurrency | two ports req/s | one port req/s | one / two | server CPU per request, "
          "two / one |")
    print("| --- | --- | --- | --- | --- |")
    failed = 0
    for point in points:
        two = [r[False][point] for r in rounds]
        one = [r[True][point] for r in rounds]
        bad = sum(map(bad_calls, two + one))
        failed += bad
        ratios = [o["rps"] / t["rps"] for o, t in zip(one, two, strict=True) if t["rps"]]
        verdict = f" FAILED: {bad} bad calls" if bad else ""
        print(f"| {point[0]}, {point[1]}, {point[2]} | {statistics.median(r['rps'] for r in two):.0f} | "
              f"{statistics.median(r['rps'] for r in one):.0f} | {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}){verdict} | "
              f"{statistics.median(r['cpu_us'] for r in two):.0f} / {statistics.median(r['cpu_us'] for r in one):.0f}"
              " µs |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
