"""Clients that ask for a large answer and do not read it: cut off at the send timeout, and held within one bound
of unsent bytes (six readers of 50 MB answers at a byte a second once took a server from 412 MB to 1,100 MB, and
one silent for 40 s still got all of its answer). On the two ports (granian) and on the one port (HTTP/1.1 served in
the server's process)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.support import ServerProcess, write_model

ANSWER_MB = 32
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MB" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "isolation" value { string_value: "thread" } }
"""
LARGE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.ones(int(pb_utils.get_input_tensor_by_name(r, "MB").as_numpy()[0] * 262144), np.float32))])
            for r in requests]
"""
MODES = {"two ports": (), "one port": ("--single-port",)}
BODY = json.dumps({"inputs": [{"name": "MB", "shape": [1], "datatype": "FP32", "data": [ANSWER_MB]}],
                   "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}]}).encode()


def _serve(tmp_path, settings: str, mode: str) -> ServerProcess:
    write_model(tmp_path / "models", "large", CONFIG, {"1/model.py": LARGE})
    config = tmp_path / "function.yaml"
    config.write_text("server:\n" + settings)
    return ServerProcess(tmp_path / "models", "--config", str(config), *MODES[mode])


def _ask_and_stall(port: int) -> socket.socket:
    """A client that sends its request and then reads nothing (a small receive buffer, as a slow reader has)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    client.sendall(b"POST /v2/models/large/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
    return client


def _read_all(client: socket.socket, timeout: float) -> tuple[int, bool]:
    """(bytes received, whether the server closed the connection) reading until EOF or ``timeout``."""
    client.settimeout(timeout)
    received = 0
    try:
        while chunk := client.recv(1 << 20):
            received += len(chunk)
    except TimeoutError:
        return received, False
    return received, True


@pytest.mark.parametrize("mode", list(MODES))
def test_a_client_that_stops_reading_is_cut_off_at_the_send_timeout(tmp_path, mode):
    with _serve(tmp_path, "  send_timeout_seconds: 2\n", mode) as server:
        stalled = _ask_and_stall(server.http_port)
        time.sleep(6)  # two seconds without taking a chunk: the server gives up on it
        with stalled:
            received, closed = _read_all(stalled, timeout=10)
        assert closed and received < ANSWER_MB << 20  # the connection ended before the answer did
        assert "stopped reading its" in server.log() and "cut off after 2s" in server.log()
        answer = httpx.post(f"http://{server.http_url}/v2/models/large/infer", content=BODY, timeout=30,
                            headers={"Accept-Encoding": "identity"})  # uncompressed: the answer's full size
        assert answer.status_code == 200 and len(answer.content) > ANSWER_MB << 20  # a reader gets it all


@pytest.mark.parametrize("mode", list(MODES))
def test_stalled_readers_make_room_for_new_answers_within_the_bound(tmp_path, mode):
    bound = (2 * ANSWER_MB + ANSWER_MB // 2) << 20  # room for two answers, not three
    with _serve(tmp_path, f"  send_timeout_seconds: 60\n  max_unsent_response_bytes: {bound}\n", mode) as server:
        stalled = [_ask_and_stall(server.http_port) for _ in range(2)]
        time.sleep(3)  # both hold their answers, stalled past a second
        answer = httpx.post(f"http://{server.http_url}/v2/models/large/infer", content=BODY, timeout=30,
                            headers={"Accept-Encoding": "identity"})  # uncompressed: the answer's full size
        assert answer.status_code == 200 and len(answer.content) > ANSWER_MB << 20
        assert "cut off to make room for other answers" in server.log()
        outcomes = [_read_all(client, timeout=10) for client in stalled]
        for client in stalled:
            client.close()
        assert any(closed and received < ANSWER_MB << 20 for received, closed in outcomes)  # one was cut off
