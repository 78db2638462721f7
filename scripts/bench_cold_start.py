"""Cold start, measured: syncing a large model from S3, and process start to ready / to first answer.

Prints one line per measurement and a ratio against the baseline measured in the same run:

- sync: a 1 GiB model file from a real S3 endpoint (moto server, its own process) into a cold cache, by our
  sync (parallel ranged GETs, checked) and by boto3's own ``download_file`` (s3transfer, 10 threads, no
  checks): ratio = boto3 seconds / ours (target >= 1.0x); then a warm restart's downloaded bytes (target 0).
- start to ready: ``bootstrap run`` from process start until /v2/health/ready answers 200 (probed every 5 ms, each
  probe a fresh connection as a platform's, light enough not to take the start's CPU), for one ONNX model
  and for one Python model (target <= 0.25 s with every listener on), the Python model beside real Triton 2.51
  when ``ORACLE_HOME`` points at a prepared oracle (../shared/triton-oracle; it carries the Python backend only).
  Each is measured with HTTP alone (as Knative's one port serves it) and with HTTP, gRPC and metrics (the
  defaults).
- start to first answer from S3: the ONNX model in a moto bucket, an empty cache: process start until the
  first inference is answered (target <= 0.5 s).
- a torch model's workers: the deployment guide's ``resnet50_pt`` (``model.py`` imports torch) with three
  instances, start to ready with the workers forked from the template, which imports torch where a model does,
  against cold interpreters (``SERVERLESS_TRITON_PYTHON_WORKERS=spawn``): ratio = spawn seconds / template's.
- the deployment guide's ``resnet50_pt`` from S3 (its ``model.py`` imports torch and loads TorchScript), a cold
  cache: process start to its first answer, beside real Triton 2.51 reading the same bucket where the oracle is
  prepared (target: ours <= 0.5x Triton's time).
- idle: a ready server with every listener on and nothing to do, for each model: the CPU its process tree uses over
  ``--idle-seconds`` (target <= 0.1% of a core) and its resident memory at rest.
- ``--ort-graph-cache`` (apart): what caching ONNX Runtime's optimized graph would save, on ResNet-50 exported to
  ONNX: a session from the model as given (graph optimizations on, Triton's default), one that also saves its
  optimized graph (what a cold cache would pay), and one from the saved graph (what a warm restart would pay).

The servers run with compiled bytecode, as an installed wheel (and so the image) has it: the checkout's
environment may set PYTHONDONTWRITEBYTECODE, so they get a bytecode cache of their own (PYTHONPYCACHEPREFIX)
that an unmeasured first start fills.

Usage: ``.venv/bin/python -m scripts.bench_cold_start [--sync-gib 1] [--repeat 3] [--skip-sync] [--ort-graph-cache]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import psutil

from examples.build_models import build_add_sub_onnx
from tests.support import IDENTITY_PYTHON_CONFIG, add_sub_config, free_port, python_model_source, write_model

ROOT = Path(__file__).resolve().parent.parent

S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
ONNX_CONFIG = add_sub_config('platform: "onnxruntime_onnx"')
IDENTITY = python_model_source(
    "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name(r, 'IN')"
    ".as_numpy())]) for r in requests]")


def start_moto(port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               env={**os.environ, **S3_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=20))


def bench_sync(endpoint: str, gib: float, repeat: int, work: Path) -> dict:
    from boto3.s3.transfer import TransferConfig

    from bootstrap.storage import StorageLocation, StorageSettings
    from bootstrap.sync import RepositorySync

    client = s3_client(endpoint)
    client.create_bucket(Bucket="sync-bench")
    size = int(gib * (1 << 30))
    source = work / "weights.bin"
    with open(source, "wb") as handle:
        block = os.urandom(1 << 24)
        for _ in range(size // len(block)):
            handle.write(block)
    client.put_object(Bucket="sync-bench", Key="repo/big/config.pbtxt", Body=IDENTITY_PYTHON_CONFIG.encode())
    client.put_object(Bucket="sync-bench", Key="repo/big/1/model.py", Body=IDENTITY.encode())
    client.upload_file(str(source), "sync-bench", "repo/big/1/weights.bin")  # as `aws s3 cp`: 8 MiB parts
    source.unlink()
    ours, theirs, warm_bytes = [], [], None
    settings = StorageSettings(endpoint_url=endpoint, region="us-east-1", addressing_style="path")
    for _ in range(repeat):
        target = work / "boto3.bin"
        started = time.perf_counter()
        client.download_file("sync-bench", "repo/big/1/weights.bin", str(target), Config=TransferConfig())
        theirs.append(time.perf_counter() - started)
        target.unlink()
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        sync = RepositorySync(StorageLocation("s3", "sync-bench", "repo/"), settings, cache)
        started = time.perf_counter()
        report = sync.sync()["big"]
        ours.append(time.perf_counter() - started)
        assert not report.error, report.error
        warm = RepositorySync(StorageLocation("s3", "sync-bench", "repo/"), settings, cache).sync()["big"]
        warm_bytes = warm.downloaded_bytes
    shutil.rmtree(work / "cache", ignore_errors=True)
    best_ours, best_theirs = min(ours), min(theirs)
    return {"bytes": size, "ours_s": best_ours, "boto3_download_file_s": best_theirs,
            "ours_MBps": size / best_ours / 1e6, "boto3_MBps": size / best_theirs / 1e6,
            "ratio": best_theirs / best_ours, "warm_restart_bytes": warm_bytes}


def probe_ready(port: int) -> bool:
    """One readiness probe as a platform makes it (a fresh connection, ``GET /v2/health/ready``, the status line).
    The benchmark's own probes, every 5 ms, must not take the CPU of the start they time: through httpx they took
    60 ms of a core during a 0.3 s start on two cores; these take 10."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as connection:
            connection.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return connection.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_ready(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Probe every 5 ms until the server on ``port`` is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        if probe_ready(port):
            return
        time.sleep(0.005)
    raise TimeoutError(f"not ready on port {port}")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def server_env(bytecode: Path, extra: dict | None = None) -> dict:
    """The server's environment: bytecode written to and read from ``bytecode``, as an installed wheel has it."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(bytecode), **(extra or {})}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def post_json(port: int, path: str, body: dict, timeout: float = 30.0) -> bytes:
    """``body`` POSTed as JSON to ``path`` over a fresh connection, as a platform's proxy forwards the request it
    held; the whole answer, which must be a 200. The first answer a benchmark times must not include its client's
    own start: ``httpx.post`` spent 30-65 ms making a client (its TLS context) before it sent anything."""
    payload = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(1 << 16):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:500]
    return answer


def answer_simple(port: int) -> None:
    data = np.ones(16, dtype=np.float32).tolist()
    inputs = [{"name": name, "shape": [1, 16], "datatype": "FP32", "data": data} for name in ("INPUT0", "INPUT1")]
    post_json(port, "/v2/models/simple/infer", {"inputs": inputs})


def answer_resnet(port: int) -> None:
    data = np.ones(3 * 8 * 8, dtype=np.float32).tolist()
    post_json(port, "/v2/models/resnet50_pt/infer",
              {"inputs": [{"name": "INPUT__0", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": data}]})


def ours_to_ready(repository: Path | str, env: dict, config: Path | None = None,
                  first_answer: Callable[[int], None] | None = None, all_endpoints: bool = False) -> float:
    port = free_port()
    command = [str(ROOT / ".venv" / "bin" / "bootstrap"), "run", "--model-repository", str(repository), "--host",
               "127.0.0.1", "--http-port", str(port)]
    if all_endpoints:
        command += ["--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    else:
        command += ["--no-grpc", "--no-metrics"]
    if config is not None:
        command += ["--config", str(config)]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    try:
        wait_ready(port, process)
        if first_answer is not None:
            first_answer(port)
        return time.perf_counter() - started
    finally:
        stop(process)


def tree_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds the process and its children have used (user and system)."""
    total = 0.0
    for each in (process, *process.children(recursive=True)):
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def tree_rss_bytes(process: psutil.Process) -> int:
    total = 0
    for each in (process, *process.children(recursive=True)):
        try:
            total += each.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def idle(repository: Path, env: dict, seconds: float) -> dict:
    """A ready server with every listener on and nothing to do: the CPU its process tree uses over ``seconds``
    (as a share of one core) and its resident memory at rest."""
    port = free_port()
    command = [str(ROOT / ".venv" / "bin" / "bootstrap"), "run", "--model-repository", str(repository), "--host",
               "127.0.0.1", "--http-port", str(port), "--grpc-port", str(free_port()), "--metrics-port",
               str(free_port())]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=tempfile.gettempdir())
    try:
        wait_ready(port, process)
        time.sleep(3.0)  # what follows the start (the metrics registry made in the background) settles
        tree = psutil.Process(process.pid)
        before, started = tree_cpu_seconds(tree), time.monotonic()
        time.sleep(seconds)
        used, elapsed = tree_cpu_seconds(tree) - before, time.monotonic() - started
        return {"cpu_share_of_core": used / elapsed, "rss_bytes": tree_rss_bytes(tree),
                "server_rss_bytes": tree.memory_info().rss, "seconds": elapsed}
    finally:
        stop(process)


def triton_to_ready(repository: Path | str, oracle: Path, first_answer: Callable[[int], None] | None = None,
                    cwd: Path | None = None) -> float:
    """Real Triton's start to ready (and to ``first_answer``), from ``cwd`` (default: beside ``repository``)."""
    site = (oracle / "ready").read_text().strip()
    port = free_port()
    command = [str(oracle / "tritonserver" / "bin" / "tritonserver"), f"--model-repository={repository}",
               f"--backend-directory={oracle / 'tritonserver' / 'backends'}",
               f"--cache-directory={oracle / 'tritonserver' / 'caches'}", "--http-address=127.0.0.1",
               f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false"]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{site}/nvidia_pytriton.libs", "PYTHONPATH": site,
           "PATH": f"{oracle / 'venv' / 'bin'}:{os.environ['PATH']}"}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=cwd or Path(repository).parent)
    try:
        wait_ready(port, process)
        if first_answer is not None:
            first_answer(port)
        return time.perf_counter() - started
    finally:
        stop(process)


def build_torch_repository(root: Path, instances: int) -> Path:
    """``resnet50_pt`` as scripts/bench_models.py builds it (its ``model.py`` imports torch)."""
    from scripts.bench_models import build_repository

    every = root.parent / "all"
    if not every.is_dir():
        build_repository(every)
    shutil.copytree(every / "resnet50_pt", root / "resnet50_pt")
    with open(root / "resnet50_pt" / "config.pbtxt", "a") as config:
        config.write(f'instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n')
    return root


def bench_ort_graph_cache(work: Path, repeat: int) -> dict:
    """Session creation for ResNet-50 (scripts/bench_models.py's, exported to ONNX): as given, saving the optimized
    graph (``optimized_model_filepath``), and from the saved graph; medians of ``repeat`` + 2, in this process."""
    import torch

    from handlers.onnx.environment import quiet_onnxruntime
    from scripts.bench_models import resnet50_module

    quiet_onnxruntime()
    import onnxruntime as ort

    given, optimized = work / "resnet50.onnx", work / "resnet50.optimized.onnx"
    torch.onnx.export(resnet50_module().eval(), (torch.ones(1, 3, 224, 224),), str(given), input_names=["INPUT__0"],
                      output_names=["OUTPUT__0"], dynamic_axes={"INPUT__0": {0: "batch"}}, dynamo=False)

    def session_seconds(path: Path, save: Path | None = None) -> float:
        options = ort.SessionOptions()  # graph optimizations all on: Triton's default and ours
        if save is not None:
            options.optimized_model_filepath = str(save)
        started = time.perf_counter()
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return time.perf_counter() - started

    session_seconds(given, optimized)
    count = repeat + 2
    return {"given_s": median_of(count, lambda: session_seconds(given)),
            "saving_s": median_of(count, lambda: session_seconds(given, work / "resaved.onnx")),
            "from_saved_s": median_of(count, lambda: session_seconds(optimized)),
            "model_bytes": given.stat().st_size}


def median_of(repeat: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sync-gib", type=float, default=1.0, help="size of the synced model file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-sync", action="store_true")
    parser.add_argument("--output", type=Path, default=ROOT / "bench_cold_start.json")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="how long the idle server is watched")
    parser.add_argument("--ort-graph-cache", action="store_true",
                        help="measure only what caching ONNX Runtime's optimized graph would save")
    args = parser.parse_args()
    if args.ort_graph_cache:
        with tempfile.TemporaryDirectory() as folder:
            cache = bench_ort_graph_cache(Path(folder), args.repeat)
        given = cache["given_s"]
        print(f"ResNet-50 ONNX ({cache['model_bytes'] / 1e6:.0f} MB), session creation: as given {given * 1000:.0f} "
              f"ms; saving its optimized graph {cache['saving_s'] * 1000:.0f} ms (a cold cache: "
              f"{cache['saving_s'] / given:.2f}x); from the saved graph {cache['from_saved_s'] * 1000:.0f} ms (a warm "
              f"restart: {cache['from_saved_s'] / given:.2f}x)")
        args.output.write_text(json.dumps({"ort_graph_cache": cache}, indent=2))
        return
    os.environ.update(S3_ENV)
    oracle = Path(os.environ["ORACLE_HOME"]) if os.environ.get("ORACLE_HOME") else None
    if oracle is not None and not (oracle / "ready").is_file():
        oracle = None
    results: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        moto_port = free_port()
        moto = start_moto(moto_port)
        endpoint = f"http://127.0.0.1:{moto_port}"
        try:
            if not args.skip_sync:
                results["sync"] = sync = bench_sync(endpoint, args.sync_gib, args.repeat, work)
                print(f"sync {sync['bytes'] / (1 << 30):.2f} GiB from moto: ours {sync['ours_s']:.2f} s "
                      f"({sync['ours_MBps']:.0f} MB/s), boto3 download_file {sync['boto3_download_file_s']:.2f} s "
                      f"({sync['boto3_MBps']:.0f} MB/s): {sync['ratio']:.2f}x (target >= 1.0x); warm restart "
                      f"downloaded {sync['warm_restart_bytes']} bytes (target 0)")
            onnx_repo, python_repo = work / "onnx" / "models", work / "python" / "models"
            build_add_sub_onnx(onnx_repo / "simple" / "1" / "model.onnx", datatype="FP32")
            write_model(onnx_repo, "simple", ONNX_CONFIG)
            write_model(python_repo, "identity", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
            env = server_env(work / "bytecode")
            for repository in (onnx_repo, python_repo):  # fills the bytecode cache; not measured
                ours_to_ready(repository, env, all_endpoints=True)
            for label, repository in (("onnx", onnx_repo), ("python", python_repo)):
                ours = median_of(args.repeat, lambda r=repository: ours_to_ready(r, env))
                every = median_of(args.repeat, lambda r=repository: ours_to_ready(r, env, all_endpoints=True))
                line = (f"start to ready, one {label} model: ours {ours:.2f} s with HTTP alone, {every:.2f} s with "
                        "HTTP, gRPC and metrics (target <= 0.25 s)")
                results[f"ready_{label}"] = {"ours_s": ours, "ours_all_endpoints_s": every}
                if oracle is not None and label == "python":  # the oracle's Triton has the Python backend only
                    triton = median_of(args.repeat, lambda r=repository: triton_to_ready(r, oracle))
                    results[f"ready_{label}"]["triton_s"] = triton
                    line += f", Triton {triton:.2f} s: ours/Triton time {ours / triton:.2f}x"
                print(line)
            torch_repo = build_torch_repository(work / "torch" / "models", instances=3)
            ours_to_ready(torch_repo, env)  # its bytecode too
            template = median_of(args.repeat, lambda: ours_to_ready(torch_repo, env))
            spawned_env = {**env, "SERVERLESS_TRITON_PYTHON_WORKERS": "spawn"}
            spawned = median_of(args.repeat, lambda: ours_to_ready(torch_repo, spawned_env))
            results["ready_torch_three_instances"] = {"template_s": template, "spawn_s": spawned}
            print(f"start to ready, resnet50_pt (imports torch) with three instances: workers forked from the "
                  f"template {template:.2f} s, cold interpreters {spawned:.2f} s: {spawned / template:.2f}x")
            for label, repository in (("onnx", onnx_repo), ("python", python_repo)):
                results[f"idle_{label}"] = rest = idle(repository, env, args.idle_seconds)
                print(f"idle, one {label} model, every listener on: CPU {rest['cpu_share_of_core'] * 100:.3f}% of a "
                      f"core over {rest['seconds']:.0f} s (target <= 0.1%); resident memory at rest "
                      f"{rest['server_rss_bytes'] / 2**20:.0f} MiB (the server), {rest['rss_bytes'] / 2**20:.0f} "
                      "MiB (with its worker processes)")
            client = s3_client(endpoint)
            client.create_bucket(Bucket="cold-start")
            config = work / "function.yaml"

            def upload(repository: Path, prefix: str) -> None:
                for path in sorted(repository.rglob("*")):
                    if path.is_file():
                        key = f"{prefix}/{path.relative_to(repository).as_posix()}"
                        client.upload_file(str(path), "cold-start", key)

            def from_s3(prefix: str, answer: Callable[[int], None]) -> float:
                """Process start to ``answer`` from s3://cold-start/<prefix>, an empty cache."""
                cache = work / f"cache-{time.monotonic_ns()}"
                config.write_text(f"cache_dir: {cache}\nstorage: {{endpoint_url: '{endpoint}', region: us-east-1, "
                                  "addressing_style: path}\n")
                return ours_to_ready(f"s3://cold-start/{prefix}", server_env(work / "bytecode", S3_ENV), config,
                                     first_answer=answer)

            upload(onnx_repo, "repo")
            first = median_of(args.repeat, lambda: from_s3("repo", answer_simple))
            results["first_answer_from_s3"] = {"ours_s": first}
            print(f"start to first answer, one onnx model from S3 (moto), cold cache: ours {first:.2f} s "
                  "(target <= 0.5 s)")
            upload(build_torch_repository(work / "guide" / "models", instances=1), "guide")
            from_s3("guide", answer_resnet)  # the bytecode of torch's path; not measured
            ours = median_of(args.repeat, lambda: from_s3("guide", answer_resnet))
            results["guide_from_s3"] = {"ours_s": ours}
            line = f"start to first answer, resnet50_pt from S3 (moto), cold cache: ours {ours:.2f} s"
            if oracle is not None:  # Triton reads the same bucket (s3://host:port/bucket/path)
                triton = median_of(args.repeat, lambda: triton_to_ready(
                    f"s3://127.0.0.1:{moto_port}/cold-start/guide", oracle, answer_resnet, cwd=work))
                results["guide_from_s3"]["triton_s"] = triton
                line += f", Triton {triton:.2f} s: ours/Triton time {ours / triton:.2f}x (target <= 0.5x)"
            print(line)
        finally:
            stop(moto)
    args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
