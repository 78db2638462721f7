"""Compressed gRPC requests on the native edge and on the one port: tritonclient's gzip and deflate answered as
uncompressed calls are, and compression bombs refused as soon as they pass the message limit, the server's memory
never growing by much more than that limit (reliability checklist 38); a malformed grpc-timeout refused plainly."""

from __future__ import annotations

import threading
import time
import zlib
from urllib.parse import unquote

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb

from runtime.grpc.native import NATIVE_EDGE_BUILT
from tests.support import ServerProcess, grpc_message, grpc_over_h2, write_add_sub_onnx

LIMIT = 32 << 20  # the servers' message limit


@pytest.fixture(scope="module", params=["native edge", "one port"])
def server(request, tmp_path_factory):
    if request.param == "native edge" and not NATIVE_EDGE_BUILT:
        pytest.skip("the native gRPC edge is not built")
    folder = tmp_path_factory.mktemp("compression")
    write_add_sub_onnx(folder / "models", "add_sub")
    (folder / "function.yaml").write_text(f"server: {{grpc_max_message_bytes: {LIMIT}}}\n")
    extra = ["--single-port", "true"] if request.param == "one port" else []
    with ServerProcess(folder / "models", "--config", str(folder / "function.yaml"), *extra) as process:
        process.call_url = process.http_url if extra else process.grpc_url
        yield process


def _infer(server: ServerProcess, algorithm: str | None) -> list:
    client = grpcclient.InferenceServerClient(server.call_url)
    try:
        inputs = []
        for name, value in (("INPUT0", np.arange(16, dtype=np.int32)), ("INPUT1", np.ones(16, np.int32))):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(value.reshape(1, 16))
            inputs.append(tensor)
        response = client.infer("add_sub", inputs, compression_algorithm=algorithm)
        return [response.as_numpy("OUTPUT0").tolist(), response.as_numpy("OUTPUT1").tolist()]
    finally:
        client.close()


def test_tritonclients_compressed_calls_are_answered_as_uncompressed_ones(server):
    plain = _infer(server, None)
    assert plain[0][0][:3] == [1, 2, 3]
    assert _infer(server, "gzip") == plain
    assert _infer(server, "deflate") == plain


def _deflated(size: int, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zeros = bytes(1 << 20)
    return b"".join([compressor.compress(zeros) for _ in range(size >> 20)] + [compressor.flush()])


def _call(server: ServerProcess, body: bytes, encoding: str = "gzip", **headers) -> tuple[str, str]:
    received, _ = grpc_over_h2(server.call_url, "ModelInfer", body,
                               [("grpc-encoding", encoding), *headers.items()])
    return received.get(b"grpc-status", b"?").decode(), unquote(received.get(b"grpc-message", b"").decode())


@pytest.mark.parametrize("encoding, wbits", [("gzip", 31), ("deflate", 15)])
def test_a_compression_bomb_is_refused_once_it_passes_the_limit(server, encoding, wbits):
    bomb = grpc_message(_deflated(1 << 30, wbits), compressed=True)  # 1 MB that inflates to 1 GiB
    process = psutil.Process(server.process.pid)
    start = process.memory_info().rss
    peak = [start]
    sampling = True

    def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        status, message = _call(server, bomb, encoding)
    finally:
        sampling = False
        sampler.join()
    assert status == "8", message  # RESOURCE_EXHAUSTED
    assert message == f"Received message larger than max (more than {LIMIT} bytes once decompressed vs. {LIMIT})"
    assert peak[0] - start < LIMIT + (64 << 20), f"grew {(peak[0] - start) >> 20} MiB"
    assert _infer(server, None)  # still serving


@pytest.mark.parametrize("what", ["not gzip", "cut short"])
def test_a_message_that_does_not_inflate_is_refused(server, what):
    whole = zlib.compress(pb.ModelInferRequest(model_name="add_sub").SerializeToString(), wbits=31)
    payload = b"\x00" * 40 if what == "not gzip" else whole[: len(whole) // 2]
    assert _call(server, grpc_message(payload, compressed=True)) == ("13", "a message could not be decompressed")


def test_a_compressed_message_within_the_limit_is_inflated_whole(server):
    """A message just under the limit inflates in several steps (the first is 1 MiB) and is then read whole: here a
    request whose inputs do not match the model, refused by validation, not by its size."""
    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(bytes(LIMIT - 1024))
    payload = zlib.compress(request.SerializeToString(), wbits=31)
    status, message = _call(server, grpc_message(payload, compressed=True))
    assert status == "3" and "INPUT" in message, message  # INVALID_ARGUMENT, from validation


def test_a_grpc_timeout_of_thousands_of_digits_is_refused_plainly(server):
    body = grpc_message(pb.ModelInferRequest(model_name="add_sub").SerializeToString())
    received, _ = grpc_over_h2(server.call_url, "ModelInfer", body, [("grpc-timeout", "9" * 5000 + "S")])
    assert received.get(b"grpc-status") in (b"3", b"13"), received  # INVALID_ARGUMENT, or grpc's own refusal
    assert "Traceback" not in server.log()
    assert _infer(server, None)
