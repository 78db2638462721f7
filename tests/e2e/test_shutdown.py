"""SIGTERM ends the function within ``shutdown_timeout_seconds`` plus a small constant, leaving no process behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from runtime.server import EXIT_CUT_OFF, EXIT_GRACE_SECONDS
from tests.support import ServerProcess, python_model_source, write_model

HANGING_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""
HANGING = python_model_source("""
time.sleep(float(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0]))
return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
        for r in requests]
""")


def children_of(pid: int) -> set[int]:
    """Every live process whose parent is ``pid`` (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _infer(url: str, seconds: float) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=7200)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    try:
        client.infer("hanging", [tensor])
    except Exception:  # noqa: BLE001 - the server goes away mid-request: that is the point
        pass
    finally:
        client.close()  # in the thread that made it: gevent's pool cannot be joined from another thread


def test_sigterm_with_requests_hung_for_an_hour_exits_within_the_bound(tmp_path):
    write_model(tmp_path / "models", "hanging", HANGING_CONFIG, {"1/model.py": HANGING})
    process = ServerProcess(tmp_path / "models", "--shutdown-timeout", "3").start()
    workers = children_of(process.process.pid)
    assert len(workers) >= 2, workers  # one worker process per instance
    clients = [threading.Thread(target=_infer, args=(process.http_url, 3600.0), daemon=True) for _ in range(2)]
    for client in clients:
        client.start()
    time.sleep(1.0)  # both requests are executing
    started = time.monotonic()
    process.process.send_signal(signal.SIGTERM)
    code = process.process.wait(timeout=3 + EXIT_GRACE_SECONDS + 10)
    took = time.monotonic() - started
    process.stop()
    assert took < 3 + 3.0, (took, process.log())  # the drain deadline plus a small constant, not the watchdog
    assert code == EXIT_CUT_OFF, process.log()
    assert "did not finish in time" in process.log()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers), [pid for pid in workers if alive(pid)]


def test_sigterm_lets_a_request_shorter_than_the_timeout_finish(tmp_path):
    write_model(tmp_path / "models", "hanging", HANGING_CONFIG, {"1/model.py": HANGING})
    process = ServerProcess(tmp_path / "models", "--shutdown-timeout", "10").start()
    results: list = []

    def call() -> None:
        client = httpclient.InferenceServerClient(process.http_url, network_timeout=60)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.5], dtype=np.float32))
        try:
            results.append(client.infer("hanging", [tensor]).as_numpy("OUT").tolist())
        finally:
            client.close()  # in the thread that made it

    client = threading.Thread(target=call)
    client.start()
    time.sleep(0.5)
    process.process.send_signal(signal.SIGTERM)
    client.join(30)
    assert process.stop() == 0, process.log()
    assert results == [[1.5]]


def test_a_draining_grpc_endpoint_finishes_what_runs_and_refuses_what_is_new(tmp_path):
    """Triton 2.58 (server #7969): during the drain, a request already running on a stream finishes; a new request
    on that stream is refused UNAVAILABLE in Triton's words; a new call is not served."""
    import queue

    import tritonclient.grpc as grpcclient

    from runtime.grpc.service import SHUTTING_DOWN

    write_model(tmp_path / "models", "hanging", HANGING_CONFIG, {"1/model.py": HANGING})
    process = ServerProcess(tmp_path / "models", "--shutdown-timeout", "10").start()
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(process.grpc_url)

    def tensor(seconds: float) -> list:
        inputs = [grpcclient.InferInput("IN", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.array([seconds], dtype=np.float32))
        return inputs

    client.start_stream(lambda result, error: answers.put(error or result))
    client.async_stream_infer("hanging", tensor(2.0), request_id="running")
    time.sleep(0.5)
    process.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    client.async_stream_infer("hanging", tensor(0.0), request_id="new")
    first, second = answers.get(timeout=30), answers.get(timeout=30)
    refused = first if isinstance(first, Exception) else second
    served = second if refused is first else first
    assert refused.message() == SHUTTING_DOWN
    assert served.as_numpy("OUT").tolist() == [2.0]
    with pytest.raises(Exception):  # noqa: B017 - refused or not connected, but never served
        grpcclient.InferenceServerClient(process.grpc_url).infer("hanging", tensor(0.0), client_timeout=5)
    client.stop_stream()
    assert process.stop() == 0, process.log()


def test_workers_exit_when_the_server_is_killed_outright(tmp_path):
    write_model(tmp_path / "models", "hanging", HANGING_CONFIG, {"1/model.py": HANGING})
    process = ServerProcess(tmp_path / "models").start()
    workers = children_of(process.process.pid)
    assert workers
    threading.Thread(target=_infer, args=(process.http_url, 3600.0), daemon=True).start()
    time.sleep(0.5)
    os.kill(process.process.pid, signal.SIGKILL)
    process.stop()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)
