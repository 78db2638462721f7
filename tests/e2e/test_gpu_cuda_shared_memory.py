"""CUDA shared memory on a GPU host (``pytest -m gpu``; scripts/gpu_check.sh runs it): Triton's own
simple_http_cudashm_client.py and simple_grpc_cudashm_client.py, unmodified, against our server; a GPU model
(TorchScript, KIND_GPU) reading its input from and writing its output to device memory the client exported; and
registrations that lie (more bytes than the client allocated, a handle that opens nothing) refused while the server
goes on serving.  The client side is tritonclient's ``cuda_shared_memory``, which needs cuda-python."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_models import (
    EXAMPLE_REPOSITORY,
    TORCH_BIAS,
    TORCH_WEIGHT,
    build_add_sub_onnx,
    build_linear_torchscript,
)
from tests.support import GPU_TESTS, ServerProcess, add_sub_config, cuda_available, write_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason=GPU_TESTS)]
EXAMPLES = Path(__file__).parent / "triton_client_examples"


@pytest.fixture(scope="module")
def cudashm():
    return pytest.importorskip("tritonclient.utils.cuda_shared_memory", reason="tritonclient's cudashm needs "
                               "cuda-python")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("cudashm") / "models"
    shutil.copytree(EXAMPLE_REPOSITORY / "simple_torch", repository / "simple_torch",
                    ignore=shutil.ignore_patterns("model.pt"))
    build_linear_torchscript(repository / "simple_torch" / "1" / "model.pt")  # KIND_GPU, 4 -> 3 features
    write_model(repository, "simple", add_sub_config('platform: "onnxruntime_onnx"', "INT32"))
    build_add_sub_onnx(repository / "simple" / "1" / "model.onnx", datatype="INT32")
    process = ServerProcess(repository, "--device", "gpu", "--allow-client-shm", "true",
                            log=Path(repository.parent) / "server.log").start(
        timeout=300)
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("example, url", [("simple_http_cudashm_client.py", "http_url"),
                                          ("simple_grpc_cudashm_client.py", "grpc_url")])
def test_tritons_cudashm_examples_pass_unmodified(served, cudashm, example, url):
    done = subprocess.run([sys.executable, str(EXAMPLES / example), "-u", getattr(served, url)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr + served.log()[-3000:]
    assert "PASS: cuda" in done.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_gpu_model_reads_and_writes_device_memory_the_client_exported(served, cudashm, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.http_url if protocol == "http" else served.grpc_url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    into = cudashm.create_shared_memory_region(f"x-{protocol}", x.nbytes, 0)
    out = cudashm.create_shared_memory_region(f"y-{protocol}", 24, 0)
    try:
        cudashm.set_shared_memory_region(into, [x])
        client.register_cuda_shared_memory(f"x-{protocol}", cudashm.get_raw_handle(into), 0, x.nbytes)
        client.register_cuda_shared_memory(f"y-{protocol}", cudashm.get_raw_handle(out), 0, 24)
        value = module.InferInput("INPUT__0", [2, 4], "FP32")
        value.set_shared_memory(f"x-{protocol}", x.nbytes)
        wanted = module.InferRequestedOutput("OUTPUT__0")
        wanted.set_shared_memory(f"y-{protocol}", 24)
        client.infer("simple_torch", [value], outputs=[wanted])
        result = cudashm.get_contents_as_numpy(out, np.float32, [2, 3])
        np.testing.assert_allclose(result, x @ TORCH_WEIGHT + TORCH_BIAS, rtol=1e-5)
        status = client.get_cuda_shared_memory_status(f"x-{protocol}")
        assert (status[0]["byte_size"] if protocol == "http" else status.regions[f"x-{protocol}"].byte_size) == 32
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(into)
        cudashm.destroy_shared_memory_region(out)


def test_registrations_that_lie_are_refused_and_the_server_goes_on(served, cudashm):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    region = cudashm.create_shared_memory_region("small", 64, 0)
    try:
        with pytest.raises(InferenceServerException, match="more than the"):
            client.register_cuda_shared_memory("small", cudashm.get_raw_handle(region), 0, 1 << 30)
        with pytest.raises(InferenceServerException, match="failed to open CUDA IPC handle"):
            client.register_cuda_shared_memory("junk", base64.b64encode(bytes(range(1, 65))), 0, 64)
        with pytest.raises(InferenceServerException, match="does not exist"):
            client.register_cuda_shared_memory("far", cudashm.get_raw_handle(region), 4096, 64)
        assert len(client.get_cuda_shared_memory_status().regions) == 0
        client.register_cuda_shared_memory("small", cudashm.get_raw_handle(region), 0, 64)
        value = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        value.set_shared_memory("small", 64, offset=32)  # 64 bytes from 32: past the registered 64
        other = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        other.set_data_from_numpy(np.ones((1, 16), np.int32))
        with pytest.raises(InferenceServerException, match="Invalid offset"):
            client.infer("simple", [value, other])
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region)
    assert client.is_server_live()


CLIENT_THAT_LEAVES = '''
import sys
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.cuda_shared_memory as cudashm

client = grpcclient.InferenceServerClient(sys.argv[1])
region = cudashm.create_shared_memory_region("leaving", 64, 0)
cudashm.set_shared_memory_region(region, [np.arange(16, dtype=np.int32)])
client.register_cuda_shared_memory("leaving", cudashm.get_raw_handle(region), 0, 64)
if sys.argv[2] == "free":
    cudashm.destroy_shared_memory_region(region)  # freed while the server holds it open
print("registered", flush=True)
'''


@pytest.mark.parametrize("how", ["free", "exit"])
def test_a_client_that_frees_its_memory_or_exits_cannot_take_the_server_down(served, cudashm, tmp_path, how):
    """The client frees its exported memory (or its process ends) while the region is registered: the server
    keeps its own mapping until unregistered, answers from it, and goes on serving."""
    script = tmp_path / "leaving.py"
    script.write_text(CLIENT_THAT_LEAVES)
    done = subprocess.run([sys.executable, str(script), served.grpc_url, how], capture_output=True, text=True,
                          timeout=120)
    assert "registered" in done.stdout, done.stdout + done.stderr
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        value = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        value.set_shared_memory("leaving", 64)
        other = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        other.set_data_from_numpy(np.ones((1, 16), np.int32))
        try:
            result = client.infer("simple", [value, other])
            assert result.as_numpy("OUTPUT0").shape == (1, 16)  # whatever the bytes, an answer
        except InferenceServerException as exc:  # or a clear error: never a crash
            assert "cuda" in str(exc).lower() or "memory" in str(exc).lower(), exc
    finally:
        client.unregister_cuda_shared_memory("leaving")
    assert client.is_server_live() and len(client.get_cuda_shared_memory_status().regions) == 0
    assert served.process.poll() is None, served.log()[-3000:]
    x = np.ones((1, 4), np.float32)  # the server's CUDA context still works: a GPU model answers
    value = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
    value.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("simple_torch", [value]).as_numpy("OUTPUT__0"),
                               x @ TORCH_WEIGHT + TORCH_BIAS, rtol=1e-5)


@pytest.fixture(scope="module")
def served_with_frontends(tmp_path_factory):
    repository = tmp_path_factory.mktemp("cudashm-frontends") / "models"
    write_model(repository, "simple", add_sub_config('platform: "onnxruntime_onnx"', "INT32"))
    build_add_sub_onnx(repository / "simple" / "1" / "model.onnx", datatype="INT32")
    process = ServerProcess(repository, "--device", "gpu", "--frontend-processes", "2", "--allow-client-shm", "true",
                            log=Path(repository.parent) / "server.log").start(timeout=300)
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("example, url", [("simple_http_cudashm_client.py", "http_url"),
                                          ("simple_grpc_cudashm_client.py", "grpc_url")])
def test_tritons_cudashm_examples_pass_through_frontend_processes(served_with_frontends, cudashm, example, url):
    for _ in range(3):  # connections land on either front end; regions live in the process owning the models
        done = subprocess.run([sys.executable, str(EXAMPLES / example), "-u", getattr(served_with_frontends, url)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr + served_with_frontends.log()[-3000:]
