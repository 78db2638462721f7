"""Whose turn it is on the server's CPU during a request: the threads that run, in order, and for how long.

    .venv/bin/python -m scripts.profile_turns --points grpc:resnet50_pt:1 http:resnet50_pt:1   # needs perf, root

At c=1 the client and the server take turns, so a lone request's rate is one over the client's time plus the
server's time up to its answer: work a server does after its answer overlaps the client's next request, work
before it does not. Each server (``scripts.bench_vs_triton``'s, on CPU 0, the load on CPU 1) serves the point alone
under ``perf record -e sched:sched_switch,syscalls:sys_enter_sendmsg`` on CPU 0; every stretch of CPU 0 between two
idle spells is one request's turns. Printed per point and server: the commonest sequences of threads (named by
role: the serving process's main thread, its other threads by name, ``worker`` for its child processes) with the
median microseconds of each turn, the median busy time a request, and, over gRPC, the time from CPU 0's wake-up to
the answer's ``sendmsg`` and after it (HTTP answers leave through ``writev``, which our worker hand-off uses too:
not told apart). A server whose CPU never idles between requests (Triton over HTTP at c=1: its threads poll)
shows fewer stretches than requests, each holding several. perf's own cost inflates every figure alike. Not a test:
the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from scripts.bench_load import load
from scripts.bench_models import build_repository
from scripts.bench_servers import start_ours, start_triton, stop_tree, wait_ready

_LINE = re.compile(r"^\s*(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)$")
_NEXT = re.compile(r"next_comm=(.*) next_pid=(\d+)")
MIN_BUSY_SECONDS = 200e-6  # shorter stretches are housekeeping (timers, RCU), not a request
SEQUENCES_SHOWN = 2


@dataclass
class Stretch:
    """One stretch of CPU 0 between idle spells: its (role, µs) turns in order, and when its first sendmsg came."""

    start: float
    turns: list[tuple[str, float]] = field(default_factory=list)
    answer_at: float | None = None
    end: float = 0.0


def roles(server_pid: int) -> dict[int, str]:
    """Thread id -> role for the server's process tree: ``main``, a thread's own name and number, or ``worker``."""
    named: dict[int, str] = {}
    seen: collections.Counter[str] = collections.Counter()
    server = psutil.Process(server_pid)
    for thread in sorted(server.threads(), key=lambda thread: thread.id):
        if thread.id == server_pid:
            named[thread.id] = "main"
            continue
        comm = Path(f"/proc/{server_pid}/task/{thread.id}/comm")
        name = comm.read_text().strip() if comm.exists() else "thread"
        seen[name] += 1
        named[thread.id] = f"{name}.{seen[name]}"  # threads of one name told apart
    for child in server.children(recursive=True):
        for thread in child.threads():
            named[thread.id] = "worker"
    return named


def stretches(perf_data: Path, named: dict[int, str]) -> list[Stretch]:
    """CPU 0's busy stretches from ``perf script``, each with its turns."""
    output = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "pid,tid,cpu,time,event,trace"],
                            capture_output=True, text=True, check=True).stdout
    found: list[Stretch] = []
    current: Stretch | None = None
    running: str | None = None
    since = 0.0
    for line in output.splitlines():
        match = _LINE.match(line)
        if match is None or match.group(3) != "000":
            continue
        at, event = float(match.group(4)), match.group(5)
        if event.startswith("syscalls:sys_enter_sendmsg"):
            if current is not None and current.answer_at is None:
                current.answer_at = at
            continue
        following = _NEXT.search(match.group(6))
        if following is None:
            continue
        if current is not None and running is not None:
            current.turns.append((running, (at - since) * 1e6))
        tid = int(following.group(2))
        if tid == 0:  # CPU 0 goes idle: the stretch ends
            if current is not None:
                current.end = at
                if at - current.start >= MIN_BUSY_SECONDS:
                    found.append(current)
            current, running = None, None
        else:
            if current is None:
                current = Stretch(at)
            running = named.get(tid, following.group(1))
        since = at
    return found


def report(label: str, found: list[Stretch], served: int) -> None:
    """The stretches' median busy time, time to the first sendmsg, and commonest sequences of turns."""
    if not found:
        print(f"  {label}: no busy stretch on CPU 0 recorded")
        return
    busy = [(stretch.end - stretch.start) * 1e6 for stretch in found]
    print(f"  {label}: {len(found)} stretches for {served} requests, median {statistics.median(busy):.0f} µs on CPU 0")
    answers = [(stretch.start, stretch.answer_at, stretch.end) for stretch in found if stretch.answer_at is not None]
    if answers:
        before = statistics.median((answer - start) * 1e6 for start, answer, _ in answers)
        after = statistics.median((end - answer) * 1e6 for _, answer, end in answers)
        print(f"    to the first sendmsg {before:.0f} µs, after it {after:.0f} ({len(answers)} stretches)")
    by_sequence = collections.defaultdict(list)
    for stretch in found:
        by_sequence[tuple(role for role, _ in stretch.turns)].append(stretch)
    commonest = sorted(by_sequence.items(), key=lambda item: -len(item[1]))[:SEQUENCES_SHOWN]
    for sequence, members in commonest:
        medians = [statistics.median(member.turns[i][1] for member in members) for i in range(len(sequence))]
        turns = " -> ".join(f"{role} {micros:.0f}" for role, micros in zip(sequence, medians, strict=True))
        print(f"    {len(members)}x: {turns} (sum {sum(medians):.0f})")


def profile_point(server: str, protocol: str, model: str, concurrency: int, requests: int, workdir: Path) -> None:
    """One server started, warmed and loaded at one point under perf, and its turns reported."""
    starter = start_ours if server == "ours" else start_triton
    repository = workdir / server
    if not repository.exists():  # one repository a server, for every point
        build_repository(repository, server)
    process, http_port, grpc_port = starter(repository, workdir)
    try:
        wait_ready(process, http_port)
        port = grpc_port if protocol == "grpc" else http_port
        load(protocol, port, model, concurrency, 200, repository)  # warm
        named = roles(process.pid)
        perf_data = workdir / f"{server}-{protocol}-{model}.data"
        recording = subprocess.Popen(
            ["perf", "record", "-q", "-e", "sched:sched_switch,syscalls:sys_enter_sendmsg", "-C", "0", "-o",
             str(perf_data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf is recording
        result = load(protocol, port, model, concurrency, requests, repository)
        recording.send_signal(2)
        recording.wait(60)
        report(f"{server}, {result['rps']:.0f} req/s", stretches(perf_data, named), result["served"])
    finally:
        stop_tree(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=["grpc:resnet50_pt:1", "http:resnet50_pt:1"],
                        metavar="PROTOCOL:MODEL:CONCURRENCY")
    parser.add_argument("--servers", nargs="+", default=["ours", "triton"], choices=["ours", "triton"])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is needed (apt install linux-perf) and the right to trace scheduler events")
    workdir = Path(tempfile.mkdtemp(prefix="profile-turns-"))
    for point in args.points:
        protocol, model, concurrency = point.split(":")
        print(f"{protocol} {model} c={concurrency}")
        for server in args.servers:
            profile_point(server, protocol, model, int(concurrency), args.requests, workdir)


if __name__ == "__main__":
    main()
