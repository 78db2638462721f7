"""A/B of our own server: two builds, or two settings, side by side, taking turns point by point for several rounds.

A speed change is kept when it measures better. On a machine whose speed drifts within minutes and where one run's
points move by 10-25%, a change of a few percent shows only against its baseline measured seconds apart, over
several rounds. Server A (the checkout at ``--base``, in a git worktree with its own native edge, or the working
tree) and server B (the working tree) run side by side, both pinned to CPU 0 like ``scripts.bench_vs_triton``'s
servers and serving its repository; at every point of every round one is measured and then the other (the order
reversed each round), with the same tritonclient load on CPU 1. Per point it prints the medians over the rounds and
their ranges, and B/A: the rate, and the CPU per request of each server's whole tree, split into the event loop
thread, the server's other threads (gRPC's, granian's) and the model worker processes, with the voluntary context
switches per request of each part (a thread that sleeps and is woken costs more than the switch itself where
switches are dear, as on VMs).

Usage: python -m scripts.bench_ab [--base REV] [--env-a K=V ...] [--env-b K=V ...]
                                  [--points grpc:resnet50_pt:32 http:add_sub_batch:1 ...] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run as a file: the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_load import bad_calls, load  # noqa: E402
from scripts.bench_models import MODELS, build_repository, point_requests  # noqa: E402
from scripts.bench_servers import ROOT, start_ours, stop_tree, wait_ready  # noqa: E402

NATIVE_SOURCES = ("runtime/*/*.cc", "runtime/*/*.h", "setup.py")  # what the extension modules are built from
PARTS = ("loop", "threads", "workers")


def tree_parts(pid: int) -> dict[str, tuple[float, int]]:
    """CPU seconds and voluntary context switches so far of the server ``pid``'s event loop thread (its main
    thread), its other threads, and its child processes (the model workers), from /proc."""
    totals = {part: [0.0, 0] for part in PARTS}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {part: (0.0, 0) for part in PARTS}
    for process in processes:
        try:
            tids = os.listdir(f"/proc/{process.pid}/task")
        except OSError:  # the process ended
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{process.pid}/task/{tid}/stat").read_text()
                status = Path(f"/proc/{process.pid}/task/{tid}/status").read_text()
            except OSError:  # the thread ended
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            part = "workers" if process.pid != pid else "loop" if int(tid) == pid else "threads"
            totals[part][0] += (int(fields[11]) + int(fields[12])) / tick
            totals[part][1] += int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
    return {part: (cpu, switches) for part, (cpu, switches) in totals.items()}


def measure(process: subprocess.Popen, protocol: str, port: int, model: str, concurrency: int,
            requests: int, repository: Path) -> dict:
    """One point's load against one server: its rate, p50, and per part µs of CPU and switches per request
    (per good answer: a call that failed or was answered wrongly is counted in ``bad_calls``)."""
    before = tree_parts(process.pid)
    result = load(protocol, port, model, concurrency, requests, repository)
    after = tree_parts(process.pid)
    for part in PARTS:
        result[f"{part}_us"] = (after[part][0] - before[part][0]) / result["served"] * 1e6
        result[f"{part}_switches"] = (after[part][1] - before[part][1]) / result["served"]
    result["cpu_us"] = sum(result[f"{part}_us"] for part in PARTS)
    return result


def checkout(base: str, into: Path) -> Path:
    """A worktree of ``base``, with this tree's built extension modules where their sources are the same, else
    those built from its own source (as a wheel, in pip's isolated build: the venv's installed package is left as
    it is)."""
    added = subprocess.run(["git", "worktree", "add", "--detach", str(into), base], cwd=ROOT, capture_output=True,
                           text=True)
    if added.returncode != 0:
        raise SystemExit(f"no worktree of {base}: {added.stderr.strip()}")
    differs = subprocess.run(["git", "diff", "--quiet", base, "--", *NATIVE_SOURCES], cwd=ROOT).returncode != 0
    if differs:
        _build_native(into)
    else:
        for library in (ROOT / "runtime").glob("*/_*.so"):
            shutil.copy2(library, into / library.relative_to(ROOT))
    return into


def _build_native(tree: Path) -> None:
    """``tree``'s extension modules built from its own source and put in place in it."""
    wheels = tree / "build-native"
    print(f"building the extension modules of {tree} ...", flush=True)
    made = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(tree)],
                          capture_output=True, text=True)
    found = list(wheels.glob("*.whl")) if made.returncode == 0 else []
    if not found:
        raise SystemExit(f"the extension modules of {tree} did not build: {made.stderr.strip()[-2000:]}")
    with zipfile.ZipFile(found[0]) as wheel:
        members = [name for name in wheel.namelist() if name.startswith("runtime/") and name.endswith(".so")]
        if not any("/_native_edge" in name for name in members):
            raise SystemExit(f"the wheel of {tree} holds no native edge (libgrpc++ not found when it was built?)")
        for member in members:
            wheel.extract(member, tree)


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def report(point: str, rows: dict[str, list[dict]]) -> None:
    a, b = rows["A"], rows["B"]

    def ratio(key: str) -> float:
        return statistics.median(r[key] for r in b) / statistics.median(r[key] for r in a)

    print(f"{point}: B/A rate {ratio('rps'):.3f}, CPU per request {ratio('cpu_us'):.3f}")
    for name, runs in rows.items():
        parts = ", ".join(f"{part} {_spread([r[f'{part}_us'] for r in runs])} us "
                          f"{statistics.median(r[f'{part}_switches'] for r in runs):.1f} sw" for part in PARTS)
        print(f"  {name}: {_spread([r['rps'] for r in runs])} req/s, p50 "
              f"{statistics.median(r['p50_ms'] for r in runs):.2f} ms, CPU {_spread([r['cpu_us'] for r in runs])}"
              f" us/req: {parts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="server A's git revision (default: the working tree, for --env-a/--env-b)")
    parser.add_argument("--env-a", nargs="*", default=[], metavar="K=V", help="server A's environment additions")
    parser.add_argument("--env-b", nargs="*", default=[], metavar="K=V", help="server B's environment additions")
    parser.add_argument("--points", nargs="+", default=["grpc:add_sub_batch:1", "grpc:resnet50_pt:32",
                                                         "http:add_sub_batch:1", "http:resnet50_pt:32"],
                        metavar="PROTOCOL:MODEL:CONCURRENCY")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="per point (a third for the large models)")
    args = parser.parse_args()
    try:
        points = [(protocol, model, int(c)) for protocol, model, c in (p.split(":") for p in args.points)]
    except ValueError:
        parser.error("a point is PROTOCOL:MODEL:CONCURRENCY, as grpc:resnet50_pt:32")
    unknown = sorted({model for _, model, _ in points} - set(MODELS) - {"add_sub_onnx"})
    if unknown:
        parser.error(f"unknown models {unknown}: {', '.join(MODELS)}, add_sub_onnx")
    workdir = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    envs = {"A": _env(args.env_a), "B": _env(args.env_b)}
    servers: dict[str, tuple[subprocess.Popen, int, int]] = {}
    rows: dict[tuple, dict[str, list[dict]]] = {}
    try:
        roots = {"A": checkout(args.base, workdir / "a") if args.base else ROOT, "B": ROOT}
        repository = build_repository(workdir / "repo", "ours")
        for name in ("A", "B"):
            servers[name] = start_ours(repository, workdir, roots[name], envs[name], f"server-{name}.log")
        for process, http_port, _ in servers.values():
            wait_ready(process, http_port)
        for round_index in range(args.rounds):
            order = ["A", "B"] if round_index % 2 == 0 else ["B", "A"]
            for protocol, model, c in points:
                count = point_requests(model, args.requests, c)
                for name in order:
                    process, http_port, grpc_port = servers[name]
                    row = measure(process, protocol, grpc_port if protocol == "grpc" else http_port, model, c, count,
                                  repository)
                    rows.setdefault((protocol, model, c), {"A": [], "B": []})[name].append(row)
                    bad = f", {bad_calls(row)} BAD CALLS: {row['first_problem']}" if bad_calls(row) else ""
                    print(f"  round {round_index + 1} {name} {protocol} {model} c={c}: {row['rps']:.0f} req/s, "
                          f"{row['cpu_us']:.0f} us/req{bad}", flush=True)
    finally:
        for process, _, _ in servers.values():
            stop_tree(process)
        if (workdir / "a").exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(workdir / "a")], cwd=ROOT,
                           capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"A: {args.base or 'the working tree'} {' '.join(args.env_a)}; B: the working tree {' '.join(args.env_b)}")
    for (protocol, model, c), point_rows in rows.items():
        report(f"{protocol} {model} c={c}", point_rows)


if __name__ == "__main__":
    main()
