"""Helpers for tests: a real `bootstrap run` subprocess on loopback, and model folders."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent


_HANDED_OUT: set[int] = set()


def cuda_available() -> bool:
    """A CUDA build of torch that sees a GPU: what the GPU tests (``-m gpu``) need, else they skip."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


GPU_TESTS = "needs an NVIDIA GPU with CUDA"


def free_port() -> int:
    """A loopback port nothing listens on, never one this process handed out before: the kernel may offer the same
    ephemeral port to two calls in a row (Triton then refused to start, its gRPC and metrics ports the same)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class ServerProcess:
    """``python -m bootstrap.cli run`` in a subprocess, on free loopback ports.

    Test repositories hold broken models on purpose, so readiness is not strict unless ``strict`` (or the
    test passes ``--strict-readiness`` itself): ``start`` waits for readiness.
    """

    def __init__(self, repository: Path, *extra: str, env: dict[str, str] | None = None, log: Path | None = None,
                 strict: bool = False):
        self.repository: Path | str = repository
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.extra = list(extra)
        if not strict and "--strict-readiness" not in self.extra:
            self.extra += ["--strict-readiness", "false"]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log_path = log or repository.parent / f"server-{self.http_port}.log"
        self.process: subprocess.Popen | None = None

    def with_repository_url(self, url: str) -> ServerProcess:
        """Serve an object-storage repository (s3://...) instead of a local folder."""
        self.repository = url
        return self

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "bootstrap.cli", "run",
            "--model-repository", str(self.repository),
            "--host", "127.0.0.1",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            *self.extra,
        ]

    def start(self, wait_ready: bool = True, timeout: float = 60.0, new_session: bool = False,
              cwd: Path = ROOT) -> ServerProcess:
        """Start it (``new_session``: as its own process group, to signal the whole group)."""
        with open(self.log_path, "wb") as log:  # the child writes through its own copy of the descriptor
            self.process = subprocess.Popen(self.command(), cwd=cwd, env=self.env, stdout=log, stderr=log,
                                            start_new_session=new_session)
        if wait_ready:
            self.wait_for("/v2/health/ready", timeout)
        return self

    def wait_for(self, path: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"http://{self.http_url}{path}", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_loaded(self, timeout: float = 120.0) -> None:
        """Wait for the initial load to finish (readiness says so only when every model loaded, if strict)."""
        deadline = time.monotonic() + timeout
        while "initial load finished" not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the initial load did not finish:\n{self.log()}")
            time.sleep(0.1)

    def lanes(self, model: str) -> tuple[int, int, int]:
        """``model``'s native lanes from the metrics: (open, serving a request now, requests served so far)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        found = {"serverless_triton_lane_open": 0, "serverless_triton_lane_executing": 0,
                 "serverless_triton_lane_requests_total": 0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in found and sample.labels.get("model") == model:
                    found[sample.name] += int(sample.value)
        return (found["serverless_triton_lane_open"], found["serverless_triton_lane_executing"],
                found["serverless_triton_lane_requests_total"])

    def wait_for_lane(self, model: str, executing: bool = False, timeout: float = 10.0) -> None:
        """Until ``model`` has a lane open (``executing``: one serving a request); AssertionError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.lanes(model)[1 if executing else 0]:
            assert time.monotonic() < deadline, f"no lane {'serving a request' if executing else 'open'} for {model}"
            time.sleep(0.01)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


Reading = TypeVar("Reading")


def settled(read: Callable[[], Reading], steady: int, interval: float, timeout: float,
            key: Callable[[Reading], object] = lambda reading: reading) -> Reading:
    """``read()`` once ``steady`` readings in a row, ``interval`` apart, agree (by ``key``), or the last one at
    ``timeout``: a count caught mid-change (a socket closing, a retired lane's buffer) is not compared."""
    deadline = time.monotonic() + timeout
    readings = [read()]
    while time.monotonic() < deadline and (len(readings) < steady
                                           or len({key(reading) for reading in readings[-steady:]}) > 1):
        time.sleep(interval)
        readings.append(read())
    return readings[-1]


def first_answer_once_admitted(open_stream: Callable[[], Iterator], timeout: float = 10.0) -> Any:
    """The first response of a gRPC stream opened by ``open_stream``, retried while the server refuses it with
    RESOURCE_EXHAUSTED (a stream's place is free once the server saw the stream before it end)."""
    import grpc

    deadline = time.monotonic() + timeout
    while True:
        try:
            return next(open_stream())
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
            time.sleep(0.05)


# A Python model in the server's own process that sums its one FP32 input of any length (the large-JSON tests and
# scripts/benchmark.py's JSON run).
JSON_SUM_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP64 dims: [ 1 ] } ]
parameters { key: "isolation" value { string_value: "thread" } }
"""
JSON_SUM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array(
            [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().sum(dtype=np.float64)]))]) for r in requests]
"""


def write_model(
    repository: Path,
    name: str,
    config: str,
    files: dict[str, str | bytes] | None = None,
) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` and ``files`` (paths relative to the model folder)."""
    folder = repository / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    for relative, content in (files or {}).items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))
    return folder


IDENTITY_PYTHON_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def write_add_sub_onnx(repository: Path, name: str, versions: tuple[int, ...] = (1,), extra: str = "") -> Path:
    """An INT32 add/sub ONNX model (``examples.build_models``) in each of ``versions``, its config plus ``extra``."""
    from examples.build_models import build_add_sub_onnx  # onnx only where a test builds one

    folder = write_model(repository, name, add_sub_config('platform: "onnxruntime_onnx"', "INT32", extra))
    for version in versions:
        build_add_sub_onnx(folder / str(version) / "model.onnx", datatype="INT32")
    return folder


def add_sub_config(header: str, datatype: str = "FP32", extra: str = "") -> str:
    """The config of ``examples.build_models.build_add_sub_onnx``'s model (INPUT0, INPUT1 -> OUTPUT0 = sum,
    OUTPUT1 = difference, dims [16], max batch 8) under ``header`` (its platform or backend line), then
    ``extra``; every framework's add/sub test model shares it."""
    config_type = f"TYPE_{datatype}"

    def tensors(*names: str) -> str:
        return ",\n  ".join(f'{{ name: "{name}" data_type: {config_type} dims: [ 16 ] }}' for name in names)

    return (f"\n{header}\nmax_batch_size: 8\ninput [\n  {tensors('INPUT0', 'INPUT1')}\n]\n"
            f"output [\n  {tensors('OUTPUT0', 'OUTPUT1')}\n]\n{extra}")


def assert_add_sub_answers(server: ServerProcess, protocol: str, model: str, batch: int, b: float) -> None:
    """``model`` (``add_sub_config``'s tensors, FP32) answers a + b and a - b for a batch of ``batch`` rows over
    ``protocol`` ("http" or "grpc"), asked with tritonclient."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b_rows = np.full((batch, 16), b, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [batch, 16], "FP32"), module.InferInput("INPUT1", [batch, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b_rows)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b_rows)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b_rows)


def python_model_source(body: str) -> str:
    """A model.py whose ``execute`` body is ``body`` (``requests`` in scope)."""
    return (
        "import json\nimport os\nimport time\nimport numpy as np\n"
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        self.args = args\n\n"
        "    def execute(self, requests):\n" + textwrap.indent(textwrap.dedent(body), " " * 8)
    )


def raw_http(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request byte for byte (no client-side path normalisation)."""
    headers = {"Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        payload = _unchunk(payload)
    return status, payload


def _unchunk(data: bytes) -> bytes:
    out, rest = [], data
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``; with ``cut_after`` set, every connection is
    reset once it has sent that many bytes back to the client (a download cut midway); with ``corrupt_at``,
    that byte of every connection's answer is flipped; with ``delay``, each 64 KiB sent back waits that long
    (a slow link)."""

    def __init__(self, upstream_port: int) -> None:
        import threading

        self.upstream_port = upstream_port
        self.cut_after: int | None = None
        self.corrupt_at: int | None = None
        self.delay = 0.0
        self.cuts = 0
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        import threading

        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, downstream: bool) -> None:
        sent = 0
        try:
            while data := source.recv(65536):
                if downstream and self.cut_after is not None and sent + len(data) > self.cut_after:
                    target.sendall(data[: max(0, self.cut_after - sent)])
                    self.cuts += 1
                    break
                if downstream and self.corrupt_at is not None and sent <= self.corrupt_at < sent + len(data):
                    flipped = bytearray(data)
                    flipped[self.corrupt_at - sent] ^= 0xFF
                    data = bytes(flipped)
                if downstream and self.delay:
                    time.sleep(self.delay)
                target.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):  # shutdown wakes the other pump's blocked recv at once
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def stop(self) -> None:
        self._stopped = True
        self._server.close()


def grpc_over_h2(url: str, method: str, body: bytes, headers: list[tuple[str, str]] = (),
                 timeout: float = 60) -> tuple[dict[bytes, bytes], bytes]:
    """One gRPC call sent frame by frame over a connection of its own (``body``: its length-prefixed messages, as
    sent, compressed or not): the response's headers and trailers together, and its body."""
    import h2.config
    import h2.connection
    import h2.events

    host, port = url.split(":")
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    received: dict[bytes, bytes] = {}
    answer = bytearray()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(connection.data_to_send())
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":authority", url),
                                         (":path", f"/inference.GRPCInferenceService/{method}"),
                                         ("content-type", "application/grpc"), ("te", "trailers"), *headers],
                                end_stream=not body)
        sent, ended = 0, False

        def take(data: bytes) -> None:
            nonlocal ended
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    received.update(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    answer.extend(event.data)
                    connection.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    ended = True

        while not ended:
            window = min(connection.local_flow_control_window(stream), connection.max_outbound_frame_size) \
                if sent < len(body) else 0
            if window > 0:
                connection.send_data(stream, body[sent:sent + window], end_stream=sent + window >= len(body))
                sent += window
            else:
                data = sock.recv(65536)
                if not data:
                    break
                take(data)
            sock.sendall(connection.data_to_send())
    return received, bytes(answer)


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message."""
    return bytes([int(compressed)]) + len(payload).to_bytes(4, "big") + payload
