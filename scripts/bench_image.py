"""The container image as a platform starts it: its size, and from ``podman run`` to ready and to the first answer.

Each run starts a fresh container of the image (scripts/build_image.sh builds it) with ``$PORT`` and the example
repository mounted read-only, on the host's network, and times ``podman run`` until ``/v2/health/ready`` answers
200, then until a first ``simple_onnx`` answer; the table gives the median of the runs, with their range.

Usage: python -m scripts.bench_image [--image localhost/serverless-triton:cpu] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.http as httpclient

if __package__ in (None, ""):  # run as a file: the project's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.build_models import EXAMPLE_REPOSITORY, build_example_models  # noqa: E402
from tests.support import free_port  # noqa: E402

PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def one_start(image: str) -> tuple[float, float]:
    """Seconds from ``podman run`` to ready, and to the first answer."""
    port = free_port()
    name = f"serverless-triton-bench-{port}"
    started = time.monotonic()
    subprocess.run([*PODMAN, "run", "-d", "--name", name, "--network", "host", *LIMITS, "-e", f"PORT={port}",
                    "-v", f"{EXAMPLE_REPOSITORY}:/models:ro", image, "--model-repository", "/models",
                    "--metrics-port", str(free_port())], capture_output=True, check=True)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > 120:
                raise SystemExit("the container never became ready")
            time.sleep(0.01)
        ready = time.monotonic() - started
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        client.infer("simple_onnx", inputs)
        answered = time.monotonic() - started
        client.close()
    finally:
        subprocess.run([*PODMAN, "rm", "-f", name], capture_output=True)
    return ready, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/serverless-triton:cpu")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    build_example_models(EXAMPLE_REPOSITORY)
    size = int(subprocess.run([*PODMAN, "image", "inspect", args.image, "--format", "{{.Size}}"],
                              capture_output=True, text=True, check=True).stdout)
    runs = [one_start(args.image) for _ in range(args.runs)]
    print(f"image {args.image}: {size / 1e6:.0f} MB")
    for label, values in (("to ready", [r[0] for r in runs]), ("to first answer", [r[1] for r in runs])):
        print(f"podman run {label}: {statistics.median(values):.2f} s (median of {len(values)}; "
              f"{min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
