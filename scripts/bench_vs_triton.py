"""Side by side with real Triton: the same Python-backend models, the same client, paired rounds, three runs.

Each server (real Triton 2.51 from the nvidia-pytriton wheel, prepared by scripts/triton_oracle.sh, and ours) runs
with its whole process tree pinned to CPU 0; the closed-loop tritonclient load (``scripts.bench_load``) runs on CPU 1
(on a one-CPU machine nothing is pinned). The models are ``scripts.bench_models``'s: ``add_sub_batch`` (per-request
overhead), ``identity_big`` (600 KB in and out), ``resnet50_pt`` (the deployment guide's model.py over a
one-convolution stand-in), ``resnet50_full`` (the same model.py over a real ResNet-50-sized network) and
``add_sub_onnx`` (ours only, held against Triton's Python add_sub_batch: not like for like, the wheel's Triton has
no ONNX Runtime backend).

Method: ``--runs`` runs (3), each starting every server afresh and measuring every point in ``--rounds`` rounds (1),
the servers taking turns point by point (the order reversed every round), so that the two figures of a ratio are
measured seconds apart. A ratio is taken within a round (ours / Triton of that round: paired), and the table gives
the median of those ratios and their range, beside each server's median rate and CPU per request (its server
process tree's CPU time over the good answers it gave). Every call is counted: a point where any call failed or
was answered wrongly (the answers are checked against the model's, every one at c=1 and a sample above) is marked
FAILED, and the script then exits 1.

Besides the ratios it prints the concurrency-1 p50 latency of ours minus Triton's against a 0.1 ms target, and the
stacks' own floors measured in the same runs: ``scripts.benchmark``'s echo servers on the native edge and on
grpcio's thread-pool server (ModelInfer answered with its inputs, no model, no checks) for add_sub_batch, and
``scripts.http_echo`` (our HTTP listener answering infer requests with their inputs) for add_sub_batch and
identity_big, pinned like the servers.

Usage: python -m scripts.bench_vs_triton [--requests N] [--concurrency 1 32] [--protocols grpc http] [--runs 3]
       [--rounds 1] [--models ...] [--servers ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python scripts/bench_vs_triton.py): the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_load import bad_calls, load  # noqa: E402
from scripts.bench_models import LABELS, MODELS, OURS_ONLY, build_repository, point_requests  # noqa: E402
from scripts.bench_servers import (  # noqa: E402
    FLOOR_STACKS,
    FLOORS,
    start_grpc_floor,
    start_http_floor,
    start_ours,
    start_triton,
    stop_tree,
    tree_cpu_seconds,
    wait_ready,
)

ROOT = Path(__file__).resolve().parents[1]
# Where the echo is the floor of the same exchange: its answer is add_sub's size.  (Its identity_big answer builds the
# tensor into the message, two copies our server does not make: measured slower than our server, it is no floor.)
FLOOR_MODELS = ("add_sub_batch",)
HTTP_FLOOR_MODELS = ("add_sub_batch", "identity_big")  # answers of the model's size (resnet50_pt's is not its input's)
LATENCY_TARGET_MS = 0.1  # ours - Triton, p50 at concurrency 1
ONE_PORT = "ours-one-port"  # our server with --single-port true: REST and gRPC on its HTTP port
ONE_PORT_TARGET = 0.9  # ours on one port / ours on two, at every point
OURS = ("ours", ONE_PORT)


def side_by_side(requests: int = 3000, concurrency: tuple[int, ...] = (1, 32),
                 protocols: tuple[str, ...] = ("grpc", "http"), servers: tuple[str, ...] = ("triton", "ours"),
                 runs: int = 3, rounds: int = 1, models: tuple[str, ...] = MODELS) -> list[dict]:
    """One row per (run, round, server, protocol, model, concurrency): every server started afresh for each run,
    all pinned to CPU 0 (one that is not being measured takes no CPU to speak of: Triton 0%, ours 0.4%), the
    servers taking turns point by point, the order reversed every round: this machine's speed drifts by tens of
    percent over minutes, which would weigh on one server's figures, not on a point's pair."""
    rows: list[dict] = []
    for run in range(runs):
        workdir = Path(tempfile.mkdtemp(prefix="bench-vs-triton-"))
        running: dict[str, tuple[subprocess.Popen, int | None, int, Path | None]] = {}
        try:
            for server in servers:
                running[server] = _start_server(server, workdir)
            for server, (process, http_port, _, _) in running.items():
                if server not in FLOORS:
                    wait_ready(process, http_port)
            for round_index in range(rounds):
                turn = run * rounds + round_index
                order = list(running) if turn % 2 == 0 else list(reversed(running))
                for protocol in protocols:
                    for model in models:
                        for c in concurrency:
                            count = point_requests(model, requests, c)
                            for server in order:
                                if _serves(server, protocol, model):
                                    rows.append({"run": run, "round": round_index,
                                                 **_measure(server, running[server], protocol, model, c, count)})
        finally:
            for process, _, _, _ in running.values():
                stop_tree(process)
            shutil.rmtree(workdir, ignore_errors=True)
    return rows


def _start_server(server: str, workdir: Path) -> tuple[subprocess.Popen, int | None, int, Path | None]:
    """``server`` started (a floor: answering already; Triton and ours: see ``wait_ready``): (its process, HTTP
    port or None, gRPC port, the repository its answers are checked against: None for a floor, an echo)."""
    if server == "floor-http":
        return (*start_http_floor(), None)
    if server in FLOORS:
        return (*start_grpc_floor(FLOOR_STACKS[server]), None)
    repository = workdir / f"repo-{server}"
    build_repository(repository, "triton" if server == "triton" else "ours")
    if server == "triton":
        return (*start_triton(repository, workdir), repository)
    return (*start_ours(repository, workdir, log_name=f"{server}.log", single_port=server == ONE_PORT), repository)


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


def _measure(server: str, started: tuple[subprocess.Popen, int | None, int, Path | None], protocol: str,
             model: str, c: int, count: int) -> dict:
    """One point's row, printed as it is measured: the load's rate, latencies and bad calls, and the server's CPU
    per good answer."""
    process, http_port, grpc_port, repository = started
    port = grpc_port if protocol == "grpc" else http_port
    assert port is not None
    before = tree_cpu_seconds(process.pid)
    row = {"server": server, "protocol": protocol, "model": model, "c": c,
           **load(protocol, port, model, c, count, repository)}
    spent = tree_cpu_seconds(process.pid) - before
    row["cpu_us"] = spent / row["served"] * 1e6 if row["served"] else float("nan")
    bad = f"  {bad_calls(row)} BAD CALLS ({row['failed']} failed, {row['wrong']} wrong): {row['first_problem']}" \
        if bad_calls(row) else ""
    print(f"  {server:6} {protocol:4} {model:13} c={c:<3} {row['rps']:8.1f} req/s  p50 {row['p50_ms']:.2f} ms  "
          f"p99 {row['p99_ms']:.2f} ms  server CPU {row['cpu_us']:.0f} us/req{bad}", flush=True)
    return row


# ours / Triton in requests per second, by (model, protocol, concurrency): issue #24's targets
TARGETS = {
    **{(model, protocol, c): 1.0 for model in ("identity_big", "resnet50_pt") for protocol in ("grpc", "http")
       for c in (1, 32)},
    ("add_sub_batch", "http", 32): 0.8, ("add_sub_batch", "grpc", 32): 0.6,
    ("add_sub_onnx", "http", 32): 1.0, ("add_sub_onnx", "grpc", 32): 1.0,
}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "n": len(values)}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rows: list[dict], ours_name: str = "ours") -> list[dict]:
    """Per point, ours (the server ``ours_name``) against Triton: each (run, round) paired (ours / Triton of the
    same round), then the median and range of those ratios; each server's median rate, CPU per request and p50;
    and the bad calls of both, which fail the point."""
    by_turn = {(r["run"], r["round"], r["server"], r["protocol"], r["model"], r["c"]): r for r in rows}
    points = sorted({(r["protocol"], r["model"], r["c"]) for r in rows if r["server"] == ours_name},
                    key=lambda p: (p[0], MODELS.index(p[1]) if p[1] in MODELS else 99, p[2]))
    out = []
    for protocol, model, c in points:
        pairs = []
        for (run, round_index, server, p, m, cc), ours in by_turn.items():
            theirs = by_turn.get((run, round_index, "triton", protocol, OURS_ONLY.get(model, model), c))
            if server == ours_name and (p, m, cc) == (protocol, model, c) and theirs:
                pairs.append((ours, theirs))
        if not pairs:
            continue
        bad = sum(bad_calls(o) for o, _ in pairs) + sum(bad_calls(t) for _, t in pairs)
        problems = [r["first_problem"] for pair in pairs for r in pair if r["first_problem"]]
        healthy = [(o, t) for o, t in pairs if o["rps"] > 0 and t["rps"] > 0 and o["cpu_us"] > 0]
        out.append({
            "protocol": protocol, "model": model, "c": c, "samples": len(pairs), "bad_calls": bad,
            "problem": problems[0] if problems else "",
            "ratio": _spread([o["rps"] / t["rps"] for o, t in healthy]) if healthy else None,
            "cpu_ratio": _spread([t["cpu_us"] / o["cpu_us"] for o, t in healthy]) if healthy else None,
            "ours": _median([o["rps"] for o, _ in pairs]), "triton": _median([t["rps"] for _, t in pairs]),
            "ours_cpu_us": _median([o["cpu_us"] for o, _ in pairs]),
            "triton_cpu_us": _median([t["cpu_us"] for _, t in pairs]),
            "p50_ms": _median([o["p50_ms"] for o, _ in pairs]),
            "triton_p50_ms": _median([t["p50_ms"] for _, t in pairs]),
            "p50_gap_ms": _spread([o["p50_ms"] - t["p50_ms"] for o, t in healthy]) if healthy else None,
            "goal": TARGETS.get((model, protocol, c)),
        })
    return out


def one_port_rows(rows: list[dict]) -> list[dict]:
    """Per point, ours on one port against ours on two, paired within each (run, round): the median and range of
    the rate ratios, each mode's median CPU per request, and the bad calls of both."""
    two = {(r["run"], r["round"], r["protocol"], r["model"], r["c"]): r for r in rows if r["server"] == "ours"}
    grouped: dict[tuple, list[tuple[dict, dict]]] = {}
    for row in rows:
        theirs = two.get((row["run"], row["round"], row["protocol"], row["model"], row["c"]))
        if row["server"] == ONE_PORT and theirs:
            grouped.setdefault((row["protocol"], row["model"], row["c"]), []).append((row, theirs))
    out = []
    for (protocol, model, c), pairs in sorted(grouped.items(), key=lambda item: (
            item[0][0], MODELS.index(item[0][1]) if item[0][1] in MODELS else 99, item[0][2])):
        healthy = [(o, t) for o, t in pairs if o["rps"] > 0 and t["rps"] > 0]
        out.append({"protocol": protocol, "model": model, "c": c,
                    "ratio": _spread([o["rps"] / t["rps"] for o, t in healthy]) if healthy else None,
                    "one_cpu_us": _median([o["cpu_us"] for o, _ in pairs]),
                    "two_cpu_us": _median([t["cpu_us"] for _, t in pairs]),
                    "bad_calls": sum(bad_calls(o) + bad_calls(t) for o, t in pairs)})
    return out


def print_one_port(table: list[dict], heading: str) -> None:
    """The one-port table: a point meets ``ONE_PORT_TARGET`` when its median ratio does and no call went bad."""
    print(f"\n{heading}ours on one port / ours on two ports, the median of the paired samples (range)")
    print("| protocol, model, concurrency | one / two | target | server CPU per request, two / one |")
    print("| --- | --- | --- | --- |")
    for row in table:
        met = row["ratio"] is not None and row["bad_calls"] == 0 and row["ratio"]["median"] >= ONE_PORT_TARGET
        verdict = f" FAILED: {row['bad_calls']} bad calls" if row["bad_calls"] else ""
        print(f"| {'gRPC' if row['protocol'] == 'grpc' else 'HTTP'} {row['model']}, {row['c']} | "
              f"{_range(row['ratio'])}{verdict} | {ONE_PORT_TARGET}x, {'met' if met else 'NOT met'} | "
              f"{row['two_cpu_us']:.0f} / {row['one_cpu_us']:.0f} µs |")


def floor_rows(rows: list[dict]) -> list[dict]:
    """The echo floors' points, each paired with Triton's of the same round: median rate ratio and CPU per request."""
    triton = {(r["run"], r["round"], r["protocol"], r["model"], r["c"]): r for r in rows if r["server"] == "triton"}
    grouped: dict[tuple, list[tuple[dict, dict]]] = {}
    for row in rows:
        theirs = triton.get((row["run"], row["round"], row["protocol"], row["model"], row["c"]))
        if row["server"] in FLOORS and theirs and row["rps"] > 0 and theirs["rps"] > 0:
            grouped.setdefault((row["server"], row["protocol"], row["model"], row["c"]), []).append((row, theirs))
    return [{"server": server, "protocol": protocol, "model": model, "c": c,
             "ratio": statistics.median(f["rps"] / t["rps"] for f, t in pairs),
             "rps": statistics.median(f["rps"] for f, _ in pairs),
             "cpu_us": statistics.median(f["cpu_us"] for f, _ in pairs),
             "triton_cpu_us": statistics.median(t["cpu_us"] for _, t in pairs),
             "bad_calls": sum(bad_calls(f) for f, _ in pairs)}
            for (server, protocol, model, c), pairs in grouped.items()]


def targets(table: list[dict]) -> list[tuple[str, float, str, float, bool]]:
    """(what, measured median, relation, goal, met) for the throughput targets (measured >= goal) and the p50
    latency target at c=1 (measured <= goal); a point with bad calls meets nothing."""
    out = []
    for row in table:
        if row["ratio"] is None:
            continue
        fine = row["bad_calls"] == 0
        against = f" (vs Triton's {OURS_ONLY[row['model']]})" if row["model"] in OURS_ONLY else ""
        if row["goal"] is not None:
            value = row["ratio"]["median"]
            out.append((f"{row['protocol']} {row['model']} c={row['c']} ours / Triton{against}", value, ">=",
                        row["goal"], fine and value >= row["goal"]))
        if row["c"] == 1 and row["model"] == "add_sub_batch" and row["p50_gap_ms"] is not None:
            value = row["p50_gap_ms"]["median"]
            out.append((f"{row['protocol']} add_sub_batch c=1 p50 ours - Triton, ms", value, "<=", LATENCY_TARGET_MS,
                        fine and value <= LATENCY_TARGET_MS))
    return out


def _range(spread: dict | None, unit: str = "x") -> str:
    if spread is None:
        return "n/a"
    if spread["n"] == 1:
        return f"{spread['median']:.2f}{unit}"
    return f"{spread['median']:.2f}{unit} ({spread['low']:.2f}-{spread['high']:.2f})"


def print_summary(table: list[dict], floors: list[dict] = (), heading: str = "") -> None:
    """The table as markdown: medians of the paired samples, their range in brackets, FAILED where a call was."""
    samples = max((row["samples"] for row in table), default=0)
    print(f"\n{heading}ours / Triton, the median of {samples} paired samples (range in brackets); requests per second "
          "and server CPU per request are each server's medians")
    print("| protocol, model, concurrency | Triton req/s | ours req/s | ours / Triton | target | "
          "server CPU per request, Triton / ours | Triton / ours, CPU ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in table:
        label = f" ({LABELS[row['model']]})" if row["model"] in LABELS else ""
        protocol = "gRPC" if row["protocol"] == "grpc" else "HTTP"
        goal = row["goal"]
        if row["bad_calls"]:
            verdict = f"FAILED: {row['bad_calls']} bad calls ({row['problem'][:120]})"
        elif goal is None:
            verdict = ""
        else:
            verdict = f"{goal:.1f}x, {'met' if row['ratio'] and row['ratio']['median'] >= goal else 'NOT met'}"
        theirs_p50, ours_p50 = ((f" (p50 {row['triton_p50_ms']:.2f} ms)", f" (p50 {row['p50_ms']:.2f} ms)")
                                if row["c"] == 1 else ("", ""))
        print(f"| {protocol} {row['model']}{label}, {row['c']} | {row['triton']:.0f}{theirs_p50} | "
              f"{row['ours']:.0f}{ours_p50} | {_range(row['ratio'])} | {verdict} | "
              f"{row['triton_cpu_us']:.0f} / {row['ours_cpu_us']:.0f} µs | {_range(row['cpu_ratio'])} |")
    for floor in floors:
        stack = "gRPC" if floor["protocol"] == "grpc" else "HTTP"
        failed = f", FAILED: {floor['bad_calls']} bad calls" if floor["bad_calls"] else ""
        print(f"  {floor['protocol']:4} {floor['model']:13} c={floor['c']:<3} the {stack} stack's floor "
              f"({FLOORS[floor['server']]}, no model): {floor['rps']:.0f} req/s = {floor['ratio']:.2f}x Triton, "
              f"{floor['cpu_us']:.0f} us of CPU per request (Triton's whole server {floor['triton_cpu_us']:.0f})"
              f"{failed}")
    for what, value, relation, goal, met in targets(table):
        if relation == "<=":  # the throughput targets are in the table
            print(f"  {what}: {value:+.2f} (target {relation} {goal:.1f}: {'met' if met else 'NOT met'})")


def commit_named() -> str:
    """The checkout's commit, with '+changes' when the tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True)
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"], choices=["grpc", "http"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--servers", nargs="+", default=["triton", "ours", "floor-native", "floor-threads",
                                                          "floor-http"],
                        choices=["triton", *OURS, *FLOORS], help="floor-native, floor-threads, floor: the native "
                        "edge, grpcio thread-pool and grpc.aio echo servers (gRPC); floor-http: our HTTP listener's "
                        f"echo (scripts.http_echo); {ONE_PORT}: ours with --single-port true")
    parser.add_argument("--single-port", action="store_true", help=f"measure {ONE_PORT} too (REST and gRPC on "
                        "one port, as a platform that gives a function one port runs it)")
    parser.add_argument("--runs", type=int, default=3, help="runs, every server started afresh for each")
    parser.add_argument("--rounds", type=int, default=1, help="rounds in a run, the servers taking turns at each "
                        "point; each round is one paired sample")
    args = parser.parse_args()
    commit = commit_named()
    servers = [*args.servers, *([ONE_PORT] if args.single_port and ONE_PORT not in args.servers else [])]
    rows = side_by_side(args.requests, tuple(args.concurrency), tuple(args.protocols), tuple(servers),
                        args.runs, args.rounds, tuple(args.models))
    for name in (name for name in OURS if name in servers):
        mode = "one port" if name == ONE_PORT else "two ports"
        print_summary(summarize(rows, name), floor_rows(rows) if name == "ours" else [],
                      heading=f"at {commit}, ours on {mode}: ")
    if ONE_PORT in servers and "ours" in servers:
        print_one_port(one_port_rows(rows), heading=f"at {commit}: ")
    bad = sum(bad_calls(row) for row in rows)
    if bad:
        print(f"\n{bad} calls failed or were answered wrongly: the run FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
