"""Model control on_demand, measured: cold-call latency (the first call loads the model) beside warm-call latency,
from local disk and from S3 (moto in server mode), for an ONNX and a Python model; and the server's memory with a
20-model repository (10 ONNX, 10 Python) loaded all at once against on demand after five models were called.

    .venv/bin/python -m scripts.bench_on_demand [--warm 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.http as httpclient

from examples.build_models import build_add_sub_onnx
from scripts.bench_cold_start import S3_ENV, s3_client, start_moto, stop
from tests.support import IDENTITY_PYTHON_CONFIG, add_sub_config, free_port, python_model_source, write_model

ROOT = Path(__file__).resolve().parent.parent
ONNX_CONFIG = add_sub_config('platform: "onnxruntime_onnx"', "INT32")
IDENTITY = python_model_source(
    "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', pb_utils.get_input_tensor_by_name(r, 'IN')"
    ".as_numpy())]) for r in requests]")


def build(root: Path) -> Path:
    for index in range(10):
        write_model(root, f"onnx{index}", ONNX_CONFIG)
        build_add_sub_onnx(root / f"onnx{index}" / "1" / "model.onnx", datatype="INT32")
        write_model(root, f"py{index}", IDENTITY_PYTHON_CONFIG, {"1/model.py": IDENTITY})
    return root


def call(client: httpclient.InferenceServerClient, name: str) -> float:
    """Seconds one call takes."""
    if name.startswith("onnx"):
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    else:
        inputs = [httpclient.InferInput("IN", [4], "FP32")]
        inputs[0].set_data_from_numpy(np.ones(4, dtype=np.float32))
    started = time.perf_counter()
    client.infer(name, inputs)
    return time.perf_counter() - started


def serve(repository: str, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", repository, "--host", "127.0.0.1",
               "--http-port", str(port), "--grpc-port", str(free_port()), "--no-metrics", "--device", "cpu", *extra]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.is_server_ready():
                return process
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not get ready")


def resident(process: subprocess.Popen) -> int:
    root = psutil.Process(process.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def cold_and_warm(repository: str, warm: int, env: dict | None = None, extra: tuple[str, ...] = ()) -> dict:
    port = free_port()
    process = serve(repository, port, "--model-control-mode", "on_demand", *extra, env=env)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        result = {}
        for name in ("onnx0", "py0"):
            cold = call(client, name)
            warm_calls = [call(client, name) for _ in range(warm)]
            result[name] = (cold * 1000, statistics.median(warm_calls) * 1000)
        for name in ("onnx1", "py1", "py2", "py3"):
            call(client, name)
        result["memory"] = resident(process)
        return result
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-on-demand-"))
    repository = build(work / "models")

    port = free_port()
    everything = serve(str(repository), port)
    try:
        all_loaded = resident(everything)
    finally:
        stop(everything)
    local = cold_and_warm(str(repository), args.warm)

    moto_port = free_port()
    moto = start_moto(moto_port)
    os.environ.update(S3_ENV)  # the client below, and the server, sign with moto's test credentials
    try:
        client = s3_client(f"http://127.0.0.1:{moto_port}")
        client.create_bucket(Bucket="models")
        for path in sorted(repository.rglob("*")):
            if path.is_file():
                client.put_object(Bucket="models", Key="repo/" + path.relative_to(repository).as_posix(),
                                  Body=path.read_bytes())
        config = work / "function.yaml"
        config.write_text(f"cache_dir: {work / 'cache'}\nstorage: {{endpoint_url: 'http://127.0.0.1:{moto_port}', "
                          "region: us-east-1, addressing_style: path}\n")
        remote = cold_and_warm("s3://models/repo", args.warm, env={**os.environ, **S3_ENV},
                               extra=("--config", str(config)))
    finally:
        stop(moto)

    print("| source | model | cold call (loads it) | warm call, median |")
    print("| --- | --- | --- | --- |")
    for source, result in (("local disk", local), ("S3 (moto)", remote)):
        for name, kind in (("onnx0", "ONNX add_sub"), ("py0", "Python identity")):
            cold, warm = result[name]
            print(f"| {source} | {kind} | {cold:.1f} ms | {warm:.2f} ms |")
    print(f"\nserver memory (process tree RSS), 20 models: all loaded at start {all_loaded / 2**20:.0f} MiB; on demand "
          f"after 6 of them were called {local['memory'] / 2**20:.0f} MiB "
          f"({local['memory'] / all_loaded:.2f}x)")


if __name__ == "__main__":
    main()
