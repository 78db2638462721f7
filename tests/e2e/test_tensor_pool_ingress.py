"""Large inputs received straight into shared memory and read there by the Python worker: the server's tensor pool
(runtime/tensor_pool.py) over HTTP (a body of several chunks is joined into it) and gRPC through the core (the
native edge copies the message's tensors into it), or over gRPC on a lane (runtime/native/lanes.py) the
lane's buffer: the model finds its input in that memory (its mapping in /proc/self/maps) at an address that is a
multiple of 64 (numpy runs its loops slower on a misaligned array), and answers it back intact. Small inputs are
copied as before."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from runtime.grpc.native import NATIVE_EDGE_BUILT
from tests.support import ServerProcess, python_model_source, write_model

WHERE = '''
def in_pool(array):
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split(maxsplit=5)
            low, high = (int(part, 16) for part in span.split("-"))
            if low <= address < high:
                return "triton-tensor-pool" in line or "triton-direct" in line
    return False

'''
EXECUTE = """
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    flag = np.array([1 if in_pool(data) else 0], dtype=np.int32)
    misaligned = np.array([data.__array_interface__["data"][0] % 64], dtype=np.int32)
    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data.copy()), pb_utils.Tensor("POOL", flag),
                                                 pb_utils.Tensor("MISALIGNED", misaligned)]))
return responses
"""
CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "POOL" data_type: TYPE_INT32 dims: [ 1 ] },
             { name: "MISALIGNED" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repository: Path = tmp_path_factory.mktemp("repo")
    source = python_model_source(EXECUTE).replace("\n\nclass TritonPythonModel",
                                                  "\n\n" + WHERE + "\nclass TritonPythonModel")
    write_model(repository, "where", CONFIG, {"1/model.py": source})
    with ServerProcess(repository) as running:
        running.wait_loaded()
        yield running


def _ask(server: ServerProcess, protocol: str, data: np.ndarray) -> tuple[np.ndarray, int, int]:
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    tensor = module.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data) if protocol == "grpc" else tensor.set_data_from_numpy(data, binary_data=True)
    outputs = None if protocol == "grpc" else [httpclient.InferRequestedOutput(name, binary_data=True)
                                               for name in ("OUT", "POOL", "MISALIGNED")]
    result = client.infer("where", [tensor], outputs=outputs)
    return result.as_numpy("OUT"), int(result.as_numpy("POOL")[0]), int(result.as_numpy("MISALIGNED")[0])


@pytest.mark.parametrize("protocol", [
    pytest.param("grpc", marks=pytest.mark.skipif(not NATIVE_EDGE_BUILT, reason="the native gRPC edge is not built")),
    "http",
])
def test_a_large_input_is_read_in_the_pool_aligned_and_comes_back_intact(server: ServerProcess, protocol: str) -> None:
    rng = np.random.default_rng(3)
    for size in (150_528, 1_000_003, 150_528):  # 600 KB (as resnet's input), 4 MB, and the first again
        data = rng.random(size, dtype=np.float32)
        for _ in range(3):
            out, in_pool, misaligned = _ask(server, protocol, data)
            np.testing.assert_array_equal(out, data)
            assert (in_pool, misaligned) == (1, 0)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_small_input_is_copied_as_before(server: ServerProcess, protocol: str) -> None:
    data = np.arange(1000, dtype=np.float32)
    out, in_pool, _ = _ask(server, protocol, data)
    np.testing.assert_array_equal(out, data)
    assert in_pool == 0


RETURNED = """
responses = []
for request in requests:
    data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
    mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
    if mode == 1:
        data += 1  # in place: the server's array is the same memory
    out = {0: data, 1: data, 2: data[::2], 3: data[1:]}[mode]
    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out), pb_utils.Tensor("AGAIN", data)]))
return responses
"""
RETURNED_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "AGAIN" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def returning_server(tmp_path_factory: pytest.TempPathFactory):
    repository: Path = tmp_path_factory.mktemp("returning")
    write_model(repository, "returned", RETURNED_CONFIG, {"1/model.py": python_model_source(RETURNED)})
    with ServerProcess(repository) as running:
        running.wait_loaded()
        yield running


@pytest.mark.parametrize("protocol", [
    pytest.param("grpc", marks=pytest.mark.skipif(not NATIVE_EDGE_BUILT, reason="the native gRPC edge is not built")),
    "http",
])
def test_an_input_returned_as_an_output_comes_back_as_the_model_left_it(returning_server: ServerProcess,
                                                                       protocol: str) -> None:
    """A large input the model returns whole goes back from the server's own array of the same memory (no copy
    into the worker's arena): as it is, changed in place, twice; a part of it is copied as any other output.  Many
    at once, each different: the memory is not reused while an answer still needs it."""
    module = grpcclient if protocol == "grpc" else httpclient
    url = returning_server.grpc_url if protocol == "grpc" else returning_server.http_url

    def ask(index: int) -> bool:
        data = np.random.default_rng(index).random(150_528, dtype=np.float32)
        mode = index % 4
        tensors = [module.InferInput("IN", [150_528], "FP32"), module.InferInput("MODE", [1], "INT32")]
        for tensor, value in zip(tensors, (data, np.array([mode], dtype=np.int32)), strict=True):
            tensor.set_data_from_numpy(value) if protocol == "grpc" else tensor.set_data_from_numpy(value,
                                                                                                  binary_data=True)
        outputs = None if protocol == "grpc" else [httpclient.InferRequestedOutput(name, binary_data=True)
                                                   for name in ("OUT", "AGAIN")]
        result = module.InferenceServerClient(url).infer("returned", tensors, outputs=outputs)
        left = data + 1 if mode == 1 else data
        expected = {0: left, 1: left, 2: left[::2], 3: left[1:]}[mode]
        return np.array_equal(result.as_numpy("OUT"), expected) and np.array_equal(result.as_numpy("AGAIN"), left)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(ask, range(96)))
