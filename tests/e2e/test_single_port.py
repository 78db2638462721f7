"""One port for REST and gRPC, against real servers: tritonclient's gRPC (sync, aio, streaming) and HTTP clients
on the same port at once; one h2c connection carrying a REST and a gRPC stream side by side, as Knative's
queue-proxy may; the token on both; $PORT turning it on; front-end processes; the drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import build_add_sub_onnx
from runtime.protocol import service_pb2
from tests.conftest import ONNX_ADD_SUB_CONFIG
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, free_port, python_model_source, write_model

DECOUPLED = """
    backend: "python"
    max_batch_size: 0
    model_transaction_policy { decoupled: true }
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
REPEAT = python_model_source("""
    for request in requests:
        sender = request.get_response_sender()
        data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        for index in range(3):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data + index)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    return None
""")
SLOW = python_model_source("time.sleep(1.5)\nreturn [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
                           "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("single-port") / "models"
    write_model(root, "simple", ONNX_ADD_SUB_CONFIG)
    build_add_sub_onnx(root / "simple" / "1" / "model.onnx", datatype="INT32")
    write_model(root, "repeat", DECOUPLED, {"1/model.py": REPEAT})
    write_model(root, "slow", IDENTITY_PYTHON_CONFIG, {"1/model.py": SLOW})
    return root


def without_haproxy() -> dict[str, str]:
    """An environment whose PATH finds no haproxy: the one port falls back to hypercorn."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    return {"PATH": os.pathsep.join(f for f in folders if not (Path(f) / "haproxy").exists())}


@pytest.fixture(scope="module", params=["haproxy", "hypercorn"])
def server(repository, request):
    if request.param == "haproxy" and not shutil.which("haproxy"):
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    env = without_haproxy() if request.param == "hypercorn" else None
    with ServerProcess(repository, "--single-port", "true", "--auth-token", "secret", env=env) as process:
        carrier = "(haproxy)" if request.param == "haproxy" else "gRPC on the same port"
        assert carrier in process.log() and ("haproxy is not installed" in process.log()) == (env is not None)
        yield process


AUTH = {"authorization": "Bearer secret"}


def _grpc_add(client: grpcclient.InferenceServerClient, value: int) -> bool:
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((1, 16), value, dtype=np.int32))
    return bool((client.infer("simple", inputs, headers=dict(AUTH)).as_numpy("OUTPUT0") == 2 * value).all())


def _http_add(client: httpclient.InferenceServerClient, value: int) -> bool:
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((1, 16), value, dtype=np.int32))
    return bool((client.infer("simple", inputs, headers=dict(AUTH)).as_numpy("OUTPUT0") == 2 * value).all())


def _stream(url: str) -> list[float]:
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=dict(AUTH))
    tensor = grpcclient.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    client.async_stream_infer("repeat", [tensor])
    firsts = []
    for _ in range(3):
        result, error = answers.get(timeout=20)
        assert error is None, error
        firsts.append(float(result.as_numpy("OUT")[0]))
    client.stop_stream()
    return firsts


def test_every_client_on_one_port_at_once(server):
    url = server.http_url
    local = threading.local()  # tritonclient's clients are one per thread

    def both(value: int) -> bool:
        if not hasattr(local, "grpc"):
            local.grpc = grpcclient.InferenceServerClient(url)
            local.http = httpclient.InferenceServerClient(url)
        return _grpc_add(local.grpc, value) and _http_add(local.http, value)

    async def aio() -> bool:
        client = grpcaio.InferenceServerClient(url)
        try:
            return await client.is_model_ready("simple", headers=dict(AUTH))
        finally:
            await client.close()

    with ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(both, i) for i in range(40)]
        streams = [pool.submit(_stream, url) for _ in range(4)]
        assert all(call.result(timeout=60) for call in calls)
        assert all(stream.result(timeout=60) == [1.0, 2.0, 3.0] for stream in streams)
    assert asyncio.run(aio())
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        grpcclient.InferenceServerClient(url).get_model_metadata("nonexistent", headers=dict(AUTH))


def test_thousands_of_grpc_calls_at_c32_on_one_connection_all_succeed(server):
    """One tritonclient (one HTTP/2 connection) with 32 calls in flight, well past the 1,000 requests after which
    hypercorn used to close a connection: the close raced the frames in flight and h2 answered them with GOAWAY
    PROTOCOL_ERROR, failing every call then open (reliability checklist 42)."""
    client = grpcclient.InferenceServerClient(server.http_url)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for index, tensor in enumerate(inputs):
        tensor.set_data_from_numpy(np.full((1, 16), index + 1, dtype=np.int32))
    outcomes: queue.SimpleQueue = queue.SimpleQueue()
    in_flight = threading.Semaphore(32)

    def done(result, error) -> None:
        outcomes.put(error if error is not None else bool((result.as_numpy("OUTPUT0") == 3).all()))
        in_flight.release()

    calls = 2500
    try:
        for _ in range(calls):
            assert in_flight.acquire(timeout=30)
            client.async_infer("simple", inputs, callback=done, headers=dict(AUTH))
        answers = [outcomes.get(timeout=30) for _ in range(calls)]
    finally:
        client.close()
    failed = [answer for answer in answers if answer is not True]
    assert failed == [], f"{len(failed)} of {calls} failed: {failed[:3]}"


def test_an_http1_answer_carries_its_reason_phrase(server):
    """As Triton's and granian's do (h2load's HTTP/1.1 client counts an answer without one as failed); hypercorn,
    the fallback, sends none."""
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    assert status_line == (b"HTTP/1.1 200 OK" if "(haproxy)" in server.log() else b"HTTP/1.1 200 ")


def test_the_token_guards_both_protocols(server):
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        grpcclient.InferenceServerClient(server.http_url).is_server_ready()
    assert httpx.get(f"http://{server.http_url}/v2/models/simple").status_code == 401
    assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200  # exempt, as on two ports


def _grpc_frame(message) -> bytes:
    payload = message.SerializeToString()
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def test_one_h2c_connection_carries_rest_and_grpc_side_by_side(server):
    """As a proxy multiplexes them: a REST stream and a gRPC stream open at once on one connection."""
    assert _h2c_rest_and_grpc(server.http_url)


def _h2c_rest_and_grpc(url: str) -> bool:
    """A REST stream and a gRPC stream open at once on one h2c connection, each answered as it should be."""
    host, port = url.split(":")
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(connection.data_to_send())
        rest, grpc_call = connection.get_next_available_stream_id(), None
        connection.send_headers(rest, [(":method", "GET"), (":path", "/v2/models/simple"), (":scheme", "http"),
                                       (":authority", url), ("authorization", "Bearer secret")],
                                end_stream=True)
        grpc_call = connection.get_next_available_stream_id()
        connection.send_headers(grpc_call, [(":method", "POST"), (":scheme", "http"), (":authority", url),
                                            (":path", "/inference.GRPCInferenceService/ModelReady"),
                                            ("content-type", "application/grpc"), ("te", "trailers"),
                                            ("authorization", "Bearer secret")])
        connection.send_data(grpc_call, _grpc_frame(service_pb2.ModelReadyRequest(name="simple")), end_stream=True)
        sock.sendall(connection.data_to_send())
        bodies: dict[int, bytes] = {rest: b"", grpc_call: b""}
        headers: dict[int, list] = {rest: [], grpc_call: []}
        ended: set[int] = set()
        while ended != {rest, grpc_call}:
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers[event.stream_id] += event.headers
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] += event.data
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
            sock.sendall(connection.data_to_send())
    assert b'"name":"simple"' in bodies[rest]
    assert (b"grpc-status", b"0") in headers[grpc_call]
    assert service_pb2.ModelReadyResponse.FromString(bodies[grpc_call][5:]).ready
    return True


def _infer_stream(connection: h2.connection.H2Connection, authority: str, kind: str, value: int) -> int:
    """A gRPC ModelInfer (``kind`` "grpc") or a REST infer of ``simple`` (INPUT0 = INPUT1 = ``value``) opened on
    ``connection``: its stream id."""
    stream = connection.get_next_available_stream_id()
    if kind == "grpc":
        message = service_pb2.ModelInferRequest(model_name="simple")
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            message.raw_input_contents.append(np.full(16, value, np.int32).tobytes())
        connection.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":authority", authority),
                                         (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                         ("content-type", "application/grpc"), ("te", "trailers"), *AUTH.items()])
        connection.send_data(stream, _grpc_frame(message), end_stream=True)
        return stream
    body = json.dumps({"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 16], "data": [value] * 16}
                                  for name in ("INPUT0", "INPUT1")]}).encode()
    connection.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":authority", authority),
                                     (":path", "/v2/models/simple/infer"), ("content-type", "application/json"),
                                     ("content-length", str(len(body))), *AUTH.items()])
    connection.send_data(stream, body, end_stream=True)
    return stream


def test_one_h2c_connection_carries_64_grpc_calls_and_64_rest_requests_at_once_for_10_seconds(server):
    """As Knative's queue-proxy pools them: one connection, 128 streams open at once, each answered as it ends by
    another of its kind; every answer correct, none failed."""
    host, port = server.http_url.split(":")
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    connection.initiate_connection()
    connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    answered = {"grpc": 0, "rest": 0}
    open_streams: dict[int, tuple[str, int]] = {}  # stream -> (kind, value sent)
    headers: dict[int, list] = {}
    bodies: dict[int, bytearray] = {}
    deadline = time.monotonic() + 10
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for value in range(64):
            for kind in ("grpc", "rest"):
                open_streams[_infer_stream(connection, server.http_url, kind, value)] = (kind, value)
        sock.sendall(connection.data_to_send())
        next_value = 64
        while open_streams:
            data = sock.recv(1 << 16)
            assert data, "the server closed the connection"
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers.setdefault(event.stream_id, []).extend(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    bodies.setdefault(event.stream_id, bytearray()).extend(event.data)
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream {event.stream_id} reset: {event.error_code}")
                elif isinstance(event, h2.events.StreamEnded):
                    kind, value = open_streams.pop(event.stream_id)
                    got = dict(headers.pop(event.stream_id))
                    body = bytes(bodies.pop(event.stream_id, b""))
                    if kind == "grpc":
                        assert got.get(b"grpc-status") == b"0", got
                        answer = service_pb2.ModelInferResponse.FromString(body[5:])
                        assert np.frombuffer(answer.raw_output_contents[0], np.int32).tolist() == [2 * value] * 16
                    else:
                        assert got[b":status"] == b"200", body
                        assert json.loads(body)["outputs"][0]["data"] == [2 * value] * 16
                    answered[kind] += 1
                    if time.monotonic() < deadline:  # another of its kind takes its place
                        value = next_value % 1000
                        open_streams[_infer_stream(connection, server.http_url, kind, value)] = (kind, value)
                        next_value += 1
            sock.sendall(connection.data_to_send())
    assert answered["grpc"] >= 64 and answered["rest"] >= 64


def test_port_sets_it_and_front_end_processes_serve_it(repository, tmp_path):
    port = free_port()
    process = ServerProcess(repository, env={"PORT": str(port)}, log=tmp_path / "server.log")
    process.http_port = port  # no --http-port, and no function.yaml where it runs: $PORT decides
    process.command = lambda: [sys.executable, "-m", "bootstrap.cli", "run", "--model-repository", str(repository),
                               "--host", "127.0.0.1", "--metrics-port", str(process.metrics_port),
                               "--frontend-processes", "2", "--strict-readiness", "false"]
    process.start(cwd=tmp_path)
    try:
        assert _grpc_add(grpcclient.InferenceServerClient(f"127.0.0.1:{port}"), 3)
        assert _http_add(httpclient.InferenceServerClient(f"127.0.0.1:{port}"), 4)
        assert _h2c_rest_and_grpc(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while "2 front-end processes serving" not in process.log() and time.monotonic() < deadline:
            time.sleep(0.05)  # readiness may be answered by the first front end before the second listens
        endpoint = f"HTTP endpoint on 127.0.0.1:{port} (HTTP/1.1 and h2c), gRPC on the same port"
        carrier = " (haproxy)" if shutil.which("haproxy") else ""  # each front end with its own acceptor and HAProxy
        assert process.log().count(endpoint + carrier) == 2, process.log()
    finally:
        assert process.stop() == 0


def test_each_connection_goes_whole_to_the_edge_the_http1_server_or_haproxy(repository, tmp_path):
    """A gRPC client's to the native edge, an HTTP/1.1 client's to the server's own HTTP/1.1 server, an h2c
    client's of another kind to HAProxy: counted by the port's acceptor."""
    if not shutil.which("haproxy"):
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    process = ServerProcess(repository, "--single-port", log=tmp_path / "server.log").start()
    try:
        grpc_client = grpcclient.InferenceServerClient(process.http_url)
        http_client = httpclient.InferenceServerClient(process.http_url)
        for value in range(3):
            assert _grpc_add(grpc_client, value) and _http_add(http_client, value)
        grpc_client.close()
        http_client.close()
        assert _h2c_rest_and_grpc(process.http_url)  # an h2c client that is not grpc's: per request, by HAProxy
    finally:
        assert process.stop() == 0
    handed = [line for line in process.log().splitlines() if "connection(s) to the gRPC edge" in line]
    assert handed, process.log()
    counts = re.search(r"handed (\d+) connection\(s\) to the gRPC edge, (\d+) to its HTTP/1.1 server, (\d+) to "
                       r"haproxy", handed[0])
    assert counts, handed[0]
    to_edge, to_http1, to_proxy = map(int, counts.groups())
    assert to_edge == 1 and to_http1 >= 1 and to_proxy == 1, handed[0]  # HTTP/1.1: the client's (and readiness)


def test_sigterm_drains_a_grpc_call_and_an_http1_request_in_flight(repository, tmp_path):
    """Both reach the model before the signal; both are answered, and the server exits 0."""
    process = ServerProcess(repository, "--single-port", "true", log=tmp_path / "server.log").start()
    result: dict = {}

    def grpc_call() -> None:
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        result["grpc"] = grpcclient.InferenceServerClient(process.http_url).infer("slow", [tensor]).as_numpy("OUT")

    def http_call() -> None:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.full(1, 2, dtype=np.float32))
        result["http"] = httpclient.InferenceServerClient(process.http_url).infer("slow", [tensor]).as_numpy("OUT")

    callers = [threading.Thread(target=grpc_call), threading.Thread(target=http_call)]
    for caller in callers:
        caller.start()
    time.sleep(0.5)  # the calls are in the model
    assert process.stop(signal.SIGTERM) == 0
    for caller in callers:
        caller.join(10)
    assert result["grpc"].tolist() == [1.0] and result["http"].tolist() == [2.0]


@pytest.mark.skipif(not shutil.which("haproxy") or not shutil.which("prlimit"), reason="needs haproxy and prlimit")
def test_haproxy_serves_the_port_under_a_low_open_file_limit(repository, tmp_path):
    """A container run with nofile 4096 (podman's and many platforms' default): HAProxy's connections and pipes fit
    the limit, so it starts and carries the port (it refused to, and the server stopped, before)."""
    process = ServerProcess(repository, "--single-port", "true", log=tmp_path / "server.log")
    command = process.command
    process.command = lambda: ["prlimit", "--nofile=4096:4096", "--", *command()]  # type: ignore[method-assign]
    with process:
        assert "gRPC on the same port (haproxy)" in process.log()
        client = grpcclient.InferenceServerClient(process.http_url)
        try:
            assert client.is_server_ready()
        finally:
            client.close()
        assert httpx.get(f"http://{process.http_url}/v2/health/ready").status_code == 200
