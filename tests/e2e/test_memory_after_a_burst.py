"""Memory goes back after a burst of large requests (reliability checklist 41): four clients owed a 50 MiB answer each
from an ONNX identity model, reading it a byte a second, then leaving. While they are owed it the server holds at
most what it owes plus one copy; 10 s after they leave it is back within 100 MiB of where it started (the tensor
pool's 64 MiB included), round after round. Before: +462 MiB kept (ONNX Runtime's arena holding the answers, glibc
keeping the freed bodies in thread arenas, each body held twice while queued)."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper, save

from tests.support import ServerProcess, write_model

MIB = 1 << 20
ANSWER = 50 * MIB
CLIENTS = 4
CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _identity(path) -> None:
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))


def _request() -> bytes:
    header = json.dumps({"inputs": [{"name": "X", "shape": [ANSWER // 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": ANSWER}}],
                         "outputs": [{"name": "Y", "parameters": {"binary_data": True}}]}).encode()
    body = header + np.full(ANSWER // 4, 1.5, np.float32).tobytes()
    return (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
            + f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body)


def _slow_reader(port: int, request: bytes, seconds: float, received: list[int]) -> None:
    """Send the request, then take a byte a second for ``seconds``, then leave."""
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(request)
        deadline = time.monotonic() + seconds
        got = 0
        while time.monotonic() < deadline:
            got += len(client.recv(1))
            time.sleep(1)
        received.append(got)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("burst")
    model = write_model(folder / "models", "identity", CONFIG)
    (model / "1").mkdir()
    _identity(model / "1" / "model.onnx")
    (folder / "function.yaml").write_text("server: {send_timeout_seconds: 60}\n")
    with ServerProcess(folder / "models", "--config", str(folder / "function.yaml"), "--grpc-port", "0") as process:
        time.sleep(1)
        process.baseline = _rss(process)  # every round is held to where the server started
        yield process


def _rss(server: ServerProcess) -> int:
    return psutil.Process(server.process.pid).memory_info().rss


@pytest.mark.parametrize("round_", [1, 2])
def test_memory_goes_back_after_slow_readers_of_large_answers_leave(server, round_):
    request = _request()
    start = server.baseline
    peak = [start]
    sampling = True

    def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], _rss(server))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    received: list[int] = []
    readers = [threading.Thread(target=_slow_reader, args=(server.http_port, request, 6, received))
               for _ in range(CLIENTS)]
    try:
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
    finally:
        sampling = False
        sampler.join()
    assert len(received) == CLIENTS and all(received), received  # each was answered
    time.sleep(10)
    after = _rss(server)
    print(f"round {round_}: start {start / MIB:.0f} MiB, peak +{(peak[0] - start) / MIB:.0f} MiB, "
          f"10 s after +{(after - start) / MIB:.0f} MiB")
    assert peak[0] - start <= 2 * CLIENTS * ANSWER, f"peak +{(peak[0] - start) / MIB:.0f} MiB"  # owed, one copy
    assert after - start <= 100 * MIB, f"+{(after - start) / MIB:.0f} MiB kept 10 s after the clients left"
