"""Front-end processes (``--frontend-processes N``): N processes serve HTTP and gRPC on the same ports over the
one process that owns the models. What a client sees must not change (tests/e2e/test_python_api.py runs whole in
this mode too); the processes must come and go with the server."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ROOT, ServerProcess

TOKEN = "front-end-token"
HEADERS = {"authorization": f"Bearer {TOKEN}"}  # passed as copies: tritonclient's HTTP client adds to the dict
FRONTENDS = 2


def frontend_pids(server: ServerProcess) -> list[int]:
    found = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if "runtime.frontends.process" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:  # exited (or a zombie not yet reaped)
            pass
    return sorted(found)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    process = ServerProcess(ROOT / "examples" / "model_repository", "--frontend-processes", str(FRONTENDS),
                            "--device", "cpu", env={"FUNCTION_AUTH_TOKEN": TOKEN},
                            log=tmp_path_factory.mktemp("frontends") / "server.log").start(timeout=120)
    process.wait_loaded()
    yield process
    process.stop()


def _add(client, module, values: np.ndarray) -> np.ndarray:
    inputs = [module.InferInput("INPUT0", list(values.shape), "FP32"), module.InferInput("INPUT1", list(values.shape),
                                                                                         "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(values)
    return client.infer("simple_onnx", inputs, headers=dict(HEADERS)).as_numpy("OUTPUT0")


def _upper(client, module, words: list[bytes]) -> np.ndarray:
    text = module.InferInput("TEXT", [len(words)], "BYTES")
    text.set_data_from_numpy(np.array(words, dtype=object))
    return client.infer("text_python", [text], headers=dict(HEADERS)).as_numpy("UPPER")


def test_the_models_are_served_by_front_end_processes(server):
    assert len(frontend_pids(server)) == FRONTENDS
    def listening(pid: int) -> set[int]:
        return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}

    for pid in frontend_pids(server):  # each front end listens on the gRPC port (SO_REUSEPORT)
        deadline = time.monotonic() + 30  # ready once one front end answers: the other may still be starting
        while server.grpc_port not in listening(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.grpc_port in listening(pid)
    owner = listening(server.process.pid)
    assert server.grpc_port not in owner  # it holds the port bound, without taking connections
    assert server.metrics_port in owner  # metrics stay with the models


def test_many_clients_over_both_protocols_get_exact_answers_and_one_set_of_statistics(server):
    before = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(
        "simple_onnx", headers=dict(HEADERS))["model_stats"][0]["inference_stats"]["success"]["count"]

    def one_client(index: int) -> int:
        module = grpcclient if index % 2 else httpclient
        client = module.InferenceServerClient(server.grpc_url if index % 2 else server.http_url)
        rng = np.random.default_rng(index)
        for _ in range(20):
            values = rng.random((3, 16), dtype=np.float32)
            np.testing.assert_array_equal(_add(client, module, values), values + values)
            assert list(_upper(client, module, [b"ab", b"c" * 5000])) == [b"AB", b"C" * 5000]
        big = [bytes([97 + index]) * 300_000]  # sent beside the link's message, not copied into it
        assert list(_upper(client, module, big)) == [big[0].upper()]
        client.close()
        return 20

    with ThreadPoolExecutor(8) as pool:
        sent = sum(pool.map(one_client, range(8)))
    after = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(
        "simple_onnx", headers=dict(HEADERS))["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after - before == sent  # every front end's requests reached the one copy of the model


def test_errors_and_auth_answer_as_in_one_process(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    values = np.ones((1, 16), np.float32)
    with pytest.raises(InferenceServerException, match="unknown model") as info:
        http.infer("missing", [httpclient.InferInput("INPUT0", [1], "FP32").set_data_from_numpy(
            np.ones(1, np.float32))], headers=dict(HEADERS))
    assert info.value.status() == "404"
    wrong = grpcclient.InferInput("INPUT0", [1, 15], "FP32").set_data_from_numpy(np.ones((1, 15), np.float32))
    other = grpcclient.InferInput("INPUT1", [1, 16], "FP32").set_data_from_numpy(values)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("simple_onnx", [wrong, other], headers=dict(HEADERS))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("simple_onnx", [other], headers={"authorization": "Bearer wrong"})
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as info:
        http.get_model_metadata("simple_onnx")
    assert info.value.status() == "401"
    assert http.is_server_ready() and grpc.is_server_ready(headers=dict(HEADERS))  # HTTP health is exempt
    assert grpc.get_model_config("simple_onnx", headers=dict(HEADERS)).config.max_batch_size > 0


def _wait_replaced(server: ServerProcess, victim: int) -> None:
    """Until ``victim`` is gone and a new front end serves in its place (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = frontend_pids(server)
        if len(pids) == FRONTENDS and victim not in pids:
            return
        time.sleep(0.1)
    raise AssertionError(f"front end {victim} was not replaced: {frontend_pids(server)}")


def test_a_front_end_that_dies_is_replaced(server):
    victim = frontend_pids(server)[0]
    os.kill(victim, signal.SIGKILL)
    _wait_replaced(server, victim)
    assert re.search(r"front-end process \d exited with code -9: starting it again", server.log())
    for _ in range(10):  # new connections, wherever they land, are answered
        client = httpclient.InferenceServerClient(server.http_url)
        np.testing.assert_array_equal(_add(client, httpclient, np.ones((1, 16), np.float32)), np.full((1, 16), 2))
        client.close()


def test_a_frozen_front_end_is_replaced(server):
    """A front end that is alive but stopped (SIGSTOP) kept its share of new connections, which timed out; its
    silence on the heartbeat now gets it killed and replaced."""
    victim = frontend_pids(server)[0]
    os.kill(victim, signal.SIGSTOP)
    frozen = time.monotonic()
    _wait_replaced(server, victim)
    assert 4 < time.monotonic() - frozen < 15  # the heartbeat timeout (5 s), not a guess made sooner
    assert re.search(r"front-end process \d sent no heartbeat for [\d.]+s \(stopped or frozen\): killing it",
                     server.log())
    for _ in range(20):  # new connections, wherever they land, are answered promptly
        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=2, network_timeout=5)
        np.testing.assert_array_equal(_add(client, httpclient, np.ones((1, 16), np.float32)), np.full((1, 16), 2))
        client.close()


def test_sigterm_drains_and_leaves_no_front_end_behind(tmp_path: Path):
    server = ServerProcess(ROOT / "examples" / "model_repository", "--frontend-processes", "2", "--device", "cpu",
                           log=tmp_path / "server.log")
    with server:
        pids = frontend_pids(server)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        np.testing.assert_array_equal(_add(client, grpcclient, np.ones((1, 16), np.float32)), np.full((1, 16), 2))
        assert server.stop() == 0, server.log()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_owner_dying_takes_its_front_ends_with_it(tmp_path: Path):
    server = ServerProcess(ROOT / "examples" / "model_repository", "--frontend-processes", "1", "--device", "cpu",
                           "--no-grpc", log=tmp_path / "server.log")
    with server:
        pids = frontend_pids(server)
        server.stop(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_a_taken_grpc_port_fails_the_start(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ServerProcess(ROOT / "examples" / "model_repository", "--frontend-processes", "2",
                               log=tmp_path / "server.log")
        server.grpc_port = taken.getsockname()[1]
        server.start(wait_ready=False)
        try:
            assert server.process.wait(60) == 1
        finally:
            server.stop()
        assert f"cannot bind the gRPC server to 127.0.0.1:{server.grpc_port}" in server.log()
        assert "Traceback" not in server.log()
