"""ModelStreamInfer: a client that sends and never reads cannot grow the server without bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support import ServerProcess, write_model

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
MESSAGES = 300
ELEMENTS = 1 << 18  # 1 MiB of FP32


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _until_steady(count: Callable[[], int], steady: float = 1.0, timeout: float = 60.0) -> int:
    """``count()`` once it has not moved for ``steady`` seconds (the client is held back); AssertionError when it
    still moves after ``timeout``."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() - since < steady:
        assert time.monotonic() < deadline, "the client was never held back"
        time.sleep(0.05)
        if (now := count()) != last:
            last, since = now, time.monotonic()
    return last


@pytest.mark.parametrize(("bound", "most"), [("stream_max_in_flight: 8", 200), ("stream_max_bytes: 16777216", 100)],
                         ids=["requests", "bytes"])
def test_a_stream_that_is_never_read_stops_being_read(tmp_path, bound, most):
    """Bounded by requests in flight, or, with 64 in flight (the default), by the bytes held (16 MiB, the default): 300
    x 1 MiB offered, the server grew 134 MiB when only requests were counted."""
    write_model(tmp_path / "models", "echo", ECHO_CONFIG, {"1/model.py": ECHO})
    config = tmp_path / "function.yaml"
    config.write_text(f"server:\n  {bound}\n")
    process = ServerProcess(tmp_path / "models", "--config", str(config)).start()
    channel = grpc.insecure_channel(process.grpc_url, options=[("grpc.max_receive_message_length", 8 << 20)])
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        payload = np.ones(ELEMENTS, dtype=np.float32).tobytes()
        sent = 0
        before = rss_bytes(process.process.pid)

        def requests():
            nonlocal sent
            for index in range(MESSAGES):
                request = service_pb2.ModelInferRequest(model_name="echo", id=str(index))
                request.inputs.add(name="IN", datatype="FP32", shape=[ELEMENTS])
                request.raw_input_contents.append(payload)
                sent += 1
                yield request

        responses = stub.ModelStreamInfer(requests())
        held = _until_steady(lambda: sent)  # the client writes as fast as the server lets it, and reads nothing
        growth = rss_bytes(process.process.pid) - before
        assert held < 120, held  # flow control held the client back: far from all 300 went out
        assert growth < most << 20, growth >> 20  # was ~500 MB for 300 x 1 MiB with no bound at all

        received: list = []
        reader = threading.Thread(target=lambda: received.extend(responses), daemon=True)
        reader.start()
        reader.join(120)
        assert len(received) == MESSAGES
        assert all(not r.error_message for r in received)
        assert sorted(int(r.infer_response.id) for r in received) == list(range(MESSAGES))
    finally:
        channel.close()
        assert process.stop() == 0, process.log()
