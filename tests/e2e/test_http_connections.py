"""Slow, silent and misbehaving HTTP clients cannot shut others out (HTTP/1.1 and h2c), on the two ports and on the
one port (``--single-port``: HTTP/1.1 served in the server's own process, h2c through HAProxy)."""

from __future__ import annotations

import json
import shutil
import socket
import time

import h2.config
import h2.connection
import h2.events
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support import ServerProcess, write_model

TOKEN = "connections-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AUTH_PAIRS = [("authorization", f"Bearer {TOKEN}")]
ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "isolation" value { string_value: "thread" } }
"""
ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy())]) for r in requests]
"""
MODES = {"two ports": (), "one port": ("--single-port",)}
BODY = {"inputs": [{"name": "IN", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def _repository(tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "echo", ECHO_CONFIG, {"1/model.py": ECHO})
    return repository


def _grpc_port(server: ServerProcess) -> int:
    return server.http_port if "--single-port" in server.extra else server.grpc_port


@pytest.fixture(scope="module", params=list(MODES))
def guarded_server(request, tmp_path_factory):
    """Auth on, short header and body timeouts, a small connection cap."""
    tmp = tmp_path_factory.mktemp("connections")
    config = tmp / "function.yaml"
    config.write_text("server:\n  header_timeout_seconds: 2\n  body_timeout_seconds: 1\n  max_connections: 40\n"
                      "  max_request_bytes: 1048576\n")
    process = ServerProcess(_repository(tmp), "--config", str(config), "--auth-token", TOKEN,
                            *MODES[request.param]).start()
    yield process
    assert process.stop() == 0, process.log()


def _open(port: int, count: int, preamble: bytes) -> list[socket.socket]:
    connections = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port), timeout=5)
        if preamble:
            connection.sendall(preamble)
        connections.append(connection)
    return connections


def _closed_by_server(connection: socket.socket, wait: float) -> bool:
    connection.settimeout(wait)
    try:
        while True:
            data = connection.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def _whole_answer(connection: socket.socket) -> bytes:
    """One HTTP/1.1 answer with a content-length, however many segments it came in."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _content_length(answer):
        chunk = connection.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def _content_length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _timed_infer(server: ServerProcess) -> float:
    started = time.monotonic()
    response = httpx.post(f"http://{server.http_url}/v2/models/echo/infer", json=BODY, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    return time.monotonic() - started


@pytest.mark.parametrize("mode", list(MODES))
def test_many_stalled_connections_do_not_shut_out_new_clients(tmp_path, mode):
    """1,500 connections that send part of a header and stall (more than shut out the old server)."""
    process = ServerProcess(_repository(tmp_path), "--auth-token", TOKEN, *MODES[mode]).start()
    try:
        stalled = _open(process.http_port, 1500, b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n")
        try:
            assert _timed_infer(process) < 2.0
            started = time.monotonic()
            assert httpx.get(f"http://{process.http_url}/v2/health/live", timeout=30).status_code == 200
            assert time.monotonic() - started < 2.0
        finally:
            for connection in stalled:
                connection.close()
    finally:
        assert process.stop() == 0, process.log()


class _FewDescriptors(ServerProcess):
    """The server under ``ulimit -n 256``."""

    def command(self) -> list[str]:
        return ["bash", "-c", 'ulimit -n 256 && exec "$@"', "bash", *super().command()]


@pytest.mark.parametrize("mode", list(MODES))
def test_at_the_descriptor_limit_the_oldest_stalled_connections_make_room(tmp_path, mode):
    """252 connections sending part of their headers used every descriptor of a server under ulimit -n 256: a health
    probe and an authenticated infer waited out the 30 s header timeout. The oldest ones still in their headers are
    closed now, so new clients get in within seconds."""
    with _FewDescriptors(_repository(tmp_path), "--auth-token", TOKEN, *MODES[mode]) as process:
        if mode == "one port" and shutil.which("haproxy"):
            assert "(haproxy)" in process.log(), process.log()  # not hypercorn's fallback, which sheds nothing
        stalled = _open(process.http_port, 252, b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n")
        try:
            time.sleep(0.5)
            started = time.monotonic()
            assert httpx.get(f"http://{process.http_url}/v2/health/live", timeout=10).status_code == 200
            assert time.monotonic() - started < 5.0
            assert _timed_infer(process) < 5.0
            assert "closed the" in process.log() and "oldest still sending their headers" in process.log()
            assert sum(_closed_by_server(connection, 0.01) for connection in stalled) > 0  # the shed ones
        finally:
            for connection in stalled:
                connection.close()


def test_stalled_headers_are_cut_off_at_the_header_timeout(guarded_server):
    stalled = _open(guarded_server.http_port, 5, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    try:
        assert all(_closed_by_server(connection, 6.0) for connection in stalled)
    finally:
        for connection in stalled:
            connection.close()


def test_the_connection_cap_holds_and_new_clients_get_in_once_stalled_ones_time_out(guarded_server):
    """100 stalled connections against a cap of 40: the cap holds, and a new client is answered
    once the header timeout (2 s) has cleared the stalled ones, not never."""
    stalled = _open(guarded_server.http_port, 100, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    try:
        waited = _timed_infer(guarded_server)
        assert waited < 2.0 + 5.0
        started = time.monotonic()
        assert httpx.get(f"http://{guarded_server.http_url}/v2/health/ready", timeout=30).status_code == 200
        assert time.monotonic() - started < 7.0
    finally:
        for connection in stalled:
            connection.close()


def test_silent_connections_never_take_a_connection_slot(guarded_server):
    silent = _open(guarded_server.http_port, 100, b"")
    try:
        assert _timed_infer(guarded_server) < 1.0
    finally:
        for connection in silent:
            connection.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_header_timeout(guarded_server):
    (connection,) = _open(guarded_server.http_port, 1, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        connection.settimeout(5)
        assert connection.recv(4096).startswith(b"HTTP/1.1 200")
        assert _closed_by_server(connection, 6.0)
    finally:
        connection.close()


def test_a_body_that_trickles_in_gets_408(guarded_server):
    head = (f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    (connection,) = _open(guarded_server.http_port, 1, head + b'{"inputs": ')
    try:
        connection.settimeout(10)
        started = time.monotonic()
        answer = _whole_answer(connection)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"did not arrive within 1s" in answer
        assert time.monotonic() - started < 5.0
    finally:
        connection.close()
    assert _timed_infer(guarded_server) < 1.0


def _h2_round(port: int, early_path: str, early_headers: list[tuple[str, str]], early_bytes: int) -> tuple:
    """On one h2c connection: 8 valid inferences and one POST of ``early_bytes`` that the server answers before
    reading its body, its body sent as flow control allows meanwhile.  Spoken with the h2 library itself: httpx's
    HTTP/2 transport fails sibling streams on its own side (LocalProtocolError) now and then once a stream it is
    uploading is reset, which made this a test of the client.  Returns (each valid stream's status, the early
    stream's status (None if it was only reset), whether the connection stayed open)."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.initiate_connection()
    body = json.dumps(BODY).encode()
    common = [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1")]
    good = []
    for _ in range(8):
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, [*common, (":path", "/v2/models/echo/infer"), *AUTH_PAIRS,
                                         ("content-length", str(len(body)))])
        connection.send_data(stream, body, end_stream=True)
        good.append(stream)
    early = connection.get_next_available_stream_id()
    connection.send_headers(early, [*common, (":path", early_path), *early_headers,
                                    ("content-length", str(early_bytes))])
    sock.sendall(connection.data_to_send())
    statuses: dict[int, str] = {}
    ended: set[int] = set()
    sent, uploading, open_ = 0, True, True
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and not (set(good) <= ended and early in ended):
            if uploading and sent < early_bytes:
                room = min(connection.local_flow_control_window(early), connection.max_outbound_frame_size,
                           early_bytes - sent)
                if room > 0:
                    connection.send_data(early, b"x" * room, end_stream=sent + room == early_bytes)
                    sent += room
            sock.sendall(connection.data_to_send())
            data = sock.recv(65536)
            if not data:
                open_ = False
                break
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = dict(event.headers)[b":status"].decode()
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended.add(event.stream_id)
                    if event.stream_id == early:
                        uploading = False
                elif isinstance(event, h2.events.DataReceived):
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.ConnectionTerminated):
                    open_ = False
            sock.sendall(connection.data_to_send())
    finally:
        sock.close()
    return [statuses.get(stream) for stream in good], statuses.get(early), open_


@pytest.mark.parametrize("bad", ["401", "404", "413"])
def test_an_early_answer_on_h2_leaves_the_other_streams_alone(guarded_server, bad):
    """One h2c connection: 8 valid inferences and one POST answered before its body is read."""
    early_path = "/v2/models/nope/infer" if bad == "404" else "/v2/models/echo/infer"
    early_headers = [] if bad == "401" else AUTH_PAIRS
    early_bytes = 3_000_000 if bad == "413" else 300_000
    for _ in range(3):  # the answer may come before, among or after the others'
        good, early, stayed_open = _h2_round(guarded_server.http_port, early_path, early_headers, early_bytes)
        assert good == ["200"] * 8, good
        assert early in (bad, None)  # its answer, unless the reset that stops its upload overtook it
        assert stayed_open


def test_stalled_grpc_connections_do_not_shut_out_grpc_clients(guarded_server):
    stalled = _open(_grpc_port(guarded_server), 300, b"PRI * HTTP/2.0\r\n\r\n")
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(guarded_server)}")
        tensor = grpcclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([5, 6], dtype=np.float32))
        started = time.monotonic()
        result = client.infer("echo", [tensor], headers={"authorization": f"Bearer {TOKEN}"}, client_timeout=10)
        assert result.as_numpy("OUT").tolist() == [5, 6]
        assert time.monotonic() - started < 2.0
        client.close()
    finally:
        for connection in stalled:
            connection.close()
