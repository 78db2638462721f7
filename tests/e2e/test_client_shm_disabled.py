"""Client shared memory is off unless the server allows it (``--allow-client-shm``), as in Triton 2.69 (server
#8721): registering and unregistering are refused with Triton's UNSUPPORTED error, the status stays answerable
and unchanged. Triton's own test (qa/L0_shared_memory ``test_client_shm_disabled_by_default``) over both
protocols, and the same for CUDA regions."""

from __future__ import annotations

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from runtime.extensions.shared_memory import CLIENT_SHM_DISABLED
from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("client-shm-off") / "models"
    write_model(repository, "echo", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source("return [None]")})
    with ServerProcess(repository) as process:  # no --allow-client-shm: Triton 2.69's default
        yield process


@pytest.fixture
def region():
    handle = shm.create_shared_memory_region("dummy_data", "/serverless_triton_dummy_data", 8)
    yield handle
    shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_shm_disabled_by_default(server, region, protocol):
    client = (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))

    def status():
        answer = client.get_system_shared_memory_status()
        return answer if protocol == "http" else list(answer.regions)

    before = status()
    assert len(before) == 0
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.register_system_shared_memory("dummy_data", "/serverless_triton_dummy_data", 8)
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.unregister_system_shared_memory("dummy_data")
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.unregister_system_shared_memory()
    assert status() == before
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.register_cuda_shared_memory("dummy_cuda", bytes(64), 0, 8)
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.unregister_cuda_shared_memory()
    cuda = client.get_cuda_shared_memory_status()
    assert len(cuda if protocol == "http" else cuda.regions) == 0


def test_the_refusal_is_triton_s_unsupported_on_each_protocol(server):
    """HTTP 501 with Triton's words; gRPC UNIMPLEMENTED (Triton maps UNSUPPORTED so on both)."""
    answer = httpx.post(f"http://{server.http_url}/v2/systemsharedmemory/region/r/register",
                        json={"key": "/serverless_triton_dummy_data", "offset": 0, "byte_size": 8})
    assert (answer.status_code, answer.json()) == (501, {"error": CLIENT_SHM_DISABLED})
    answer = httpx.post(f"http://{server.http_url}/v2/cudasharedmemory/unregister")
    assert (answer.status_code, answer.json()) == (501, {"error": CLIENT_SHM_DISABLED})
    assert httpx.get(f"http://{server.http_url}/v2/systemsharedmemory/status").json() == []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.unregister_system_shared_memory()
    assert refused.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert refused.value.message() == CLIENT_SHM_DISABLED
