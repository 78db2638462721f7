"""The container image, run as a platform runs it: built by scripts/build_image.sh (podman, a Debian base of its own,
the project's Dockerfile), then started with ``$PORT`` and a repository mounted read-only, or cold-starting from S3
(moto on the host's network), and stopped as docker stops a container.

Where podman is not installed or the image is not built, every test here is skipped with that reason (CI has no
image: building it takes minutes and downloads the image's packages; SERVERLESS_TRITON_REQUIRE_IMAGE=1 turns the
skip into a failure). The engine runs as the issue that asked for the image found it must here: the runc runtime,
ulimits at or under the host's, the host's network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from examples.build_models import EXAMPLE_REPOSITORY, build_example_models
from tests.conftest import S3_ENV
from tests.support import free_port, python_model_source, write_model

IMAGE = os.environ.get("SERVERLESS_TRITON_IMAGE", "localhost/serverless-triton:cpu")
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
UID = 10001


def _missing() -> str | None:
    """Why the image cannot run here; None where it can."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman (with runc) is not installed: scripts/build_image.sh installs it and builds the image"
    if subprocess.run([*PODMAN, "image", "exists", IMAGE], capture_output=True).returncode != 0:
        return f"the image {IMAGE} is not built: scripts/build_image.sh"
    return None


MISSING = _missing()
if MISSING is not None and os.environ.get("SERVERLESS_TRITON_REQUIRE_IMAGE"):
    raise RuntimeError(MISSING)
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


# Beside the module's container (which keeps the image's default metrics port, as a platform runs it), each other
# container takes a metrics port of its own on the host's network.
def own_ports(*arguments: str) -> tuple[str, ...]:
    return ("--metrics-port", str(free_port()), *arguments)


class Container:
    """One container of the image on the host's network, its HTTP (and gRPC) on ``port``."""

    def __init__(self, port: int, *options: str, arguments: tuple[str, ...] = ()) -> None:
        self.port = port
        self.name = f"serverless-triton-test-{port}"
        command = [*PODMAN, "run", "-d", "--name", self.name, "--network", "host", *LIMITS, "-e", f"PORT={port}",
                   *options, IMAGE, *arguments]
        started = subprocess.run(command, capture_output=True, text=True)
        assert started.returncode == 0, started.stderr
        self.started_at = time.monotonic()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds from ``podman run`` returning to ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return time.monotonic() - self.started_at
            except httpx.HTTPError:
                pass
            if self.state()["Status"] == "exited":
                break
            time.sleep(0.05)
        raise AssertionError(f"the container never became ready:\n{self.logs()}")

    def state(self) -> dict:
        found = subprocess.run([*PODMAN, "inspect", "--format", "{{json .State}}", self.name], capture_output=True,
                               text=True, check=True)
        return json.loads(found.stdout)

    def logs(self) -> str:
        logged = subprocess.run([*PODMAN, "logs", self.name], capture_output=True, text=True)
        return logged.stdout + logged.stderr  # the server logs to its stderr

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*PODMAN, "exec", self.name, *command], capture_output=True, text=True)

    def stop(self, timeout: int = 30) -> int:
        """``docker stop``: SIGTERM, then SIGKILL after ``timeout`` seconds; the exit code."""
        subprocess.run([*PODMAN, "stop", "-t", str(timeout), self.name], capture_output=True, check=True)
        return int(self.state()["ExitCode"])

    def remove(self) -> None:
        subprocess.run([*PODMAN, "rm", "-f", self.name], capture_output=True)


@pytest.fixture(scope="module")
def example_repository() -> Path:
    build_example_models(EXAMPLE_REPOSITORY)
    return EXAMPLE_REPOSITORY


@pytest.fixture(scope="module")
def function(example_repository) -> Iterator[Container]:
    """``PORT`` and the example repository mounted read-only: nothing else."""
    container = Container(free_port(), "-v", f"{example_repository}:/models:ro")
    try:
        container.wait_ready()
        yield container
    finally:
        container.remove()


def test_the_platforms_port_serves_rest_and_grpc_as_the_readme_calls_them(function):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    client = httpclient.InferenceServerClient(function.url)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    assert client.infer("simple_onnx", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    text = httpclient.InferInput("TEXT", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"hello", b"world"], dtype=object))
    assert client.infer("text_python", [text]).as_numpy("UPPER").tolist() == [b"HELLO", b"WORLD"]
    client.close()

    grpc_client = grpcclient.InferenceServerClient(function.url)  # the same port
    grpc_inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in grpc_inputs:
        tensor.set_data_from_numpy(a)
    assert grpc_client.infer("simple_onnx", grpc_inputs).as_numpy("OUTPUT1").tolist() == (a - a).tolist()
    assert grpc_client.is_model_ready("simple_torch")
    grpc_client.close()


def test_the_openai_client_is_answered_on_the_platforms_port(function):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://{function.url}/v1", api_key="none")
    answer = client.chat.completions.create(model="tiny_llm", messages=[{"role": "user", "content": "the model"}])
    assert answer.choices[0].message.content
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model="tiny_llm", prompt="The server", max_tokens=8, stream=True) if chunk.choices)
    assert streamed


def test_it_runs_as_its_user_and_its_healthcheck_passes(function):
    assert function.run("id", "-u").stdout.strip() == str(UID)
    checked = subprocess.run([*PODMAN, "healthcheck", "run", function.name], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


SLOW = python_model_source("""
    time.sleep(2)
    return [pb_utils.InferenceResponse([pb_utils.Tensor(
        "OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())]) for request in requests]
""")
SLOW_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_docker_stop_drains_a_request_in_flight_and_exits_0(tmp_path):
    write_model(tmp_path / "models", "slow", SLOW_CONFIG, {"1/model.py": SLOW})
    container = Container(free_port(), "-v", f"{tmp_path / 'models'}:/models:ro",
                          arguments=own_ports("--model-repository", "/models"))
    try:
        container.wait_ready()
        answers: list = []

        def call() -> None:
            client = httpclient.InferenceServerClient(container.url, network_timeout=60)
            tensor = httpclient.InferInput("IN", [2], "FP32")
            tensor.set_data_from_numpy(np.array([1.5, 2.5], np.float32))
            answers.append(client.infer("slow", [tensor]).as_numpy("OUT").tolist())

        request = threading.Thread(target=call)
        request.start()
        time.sleep(0.5)  # the request is executing
        assert container.stop(30) == 0, container.logs()
        request.join(30)
        assert answers == [[1.5, 2.5]], container.logs()
    finally:
        container.remove()


def test_a_read_only_root_with_only_the_cache_writable_still_serves(example_repository, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, UID, UID)
    container = Container(free_port(), "--read-only", "--read-only-tmpfs=false", "-v",
                          f"{cache}:/home/triton/.cache", "-v", f"{example_repository}:/models:ro",
                          arguments=own_ports("--model-repository", "/models"))
    try:
        container.wait_ready()
        text = httpclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"read-only"], dtype=object))
        client = httpclient.InferenceServerClient(container.url)
        assert client.infer("text_python", [text]).as_numpy("UPPER").tolist() == [b"READ-ONLY"]
        assert container.run("touch", "/home/triton/elsewhere").returncode != 0  # the root is read-only
        assert "temp files go to /home/triton/.cache/serverless-triton/tmp" in container.logs()  # the one port's
    finally:
        container.remove()


def test_a_cold_start_from_s3_inside_the_container(s3, moto_endpoint, bucket, example_repository, tmp_path):
    for path in (example_repository / "simple_onnx").rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"repo/{path.relative_to(example_repository)}")
    config = tmp_path / "function.yaml"
    config.write_text(f"storage: {{endpoint_url: '{moto_endpoint}', region: us-east-1, addressing_style: path}}\n")
    environment = [option for key, value in S3_ENV.items() for option in ("-e", f"{key}={value}")]
    container = Container(free_port(), *environment, "-v", f"{config}:/config/function.yaml:ro",
                          arguments=own_ports("--config", "/config/function.yaml", "--model-repository",
                                              f"s3://{bucket}/repo"))
    try:
        container.wait_ready()
        a = np.ones((1, 16), np.float32)
        client = httpclient.InferenceServerClient(container.url)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert client.infer("simple_onnx", inputs).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
    finally:
        container.remove()
