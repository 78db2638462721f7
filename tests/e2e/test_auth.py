"""Token auth on every HTTP route and every gRPC method; nothing runs without the token."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support import IDENTITY_PYTHON_CONFIG, ServerProcess, python_model_source, write_model

TOKEN = "s3cr3t-token"


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("auth") / "executed.txt"


def executions(marker: Path) -> int:
    """How many times the model has executed so far."""
    return len(marker.read_text()) if marker.exists() else 0


GRPC_FRONT_ENDS = {"grpc-native": [], "grpc-threads": ["--grpc-native-edge", "false"],
                   "grpc-aio": ["--grpc-native-edge", "false", "--grpc-infer-threads", "0"]}


@pytest.fixture(scope="module", params=list(GRPC_FRONT_ENDS))
def auth_server(request, tmp_path_factory, marker):
    repository = tmp_path_factory.mktemp("auth-repo") / "models"
    write_model(repository, "marker_python", IDENTITY_PYTHON_CONFIG, {"1/model.py": python_model_source(
        f"open({str(marker)!r}, 'a').write('x')\n"
        "return [pb_utils.InferenceResponse([pb_utils.Tensor('OUT', "
        "pb_utils.get_input_tensor_by_name(r, 'IN').as_numpy())]) for r in requests]"
    )})
    process = ServerProcess(repository, *GRPC_FRONT_ENDS[request.param], env={"FUNCTION_AUTH_TOKEN": TOKEN}).start()
    yield process
    assert process.stop() == 0


HTTP_ROUTES = [
    ("GET", "/v2"),
    ("GET", "/v2/models/marker_python"),
    ("GET", "/v2/models/marker_python/versions/1"),
    ("GET", "/v2/models/marker_python/ready"),
    ("GET", "/v2/models/marker_python/config"),
    ("GET", "/v2/models/marker_python/stats"),
    ("GET", "/v2/models/stats"),
    ("POST", "/v2/models/marker_python/infer"),
    ("POST", "/v2/models/marker_python/versions/1/infer"),
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/no/such/route"),
]
INFER_BODY = b'{"inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [1.0]}]}'


@pytest.mark.parametrize("method, path", HTTP_ROUTES)
@pytest.mark.parametrize("authorization", [None, "wrong", "Bearer wrong", f"Basic {TOKEN}", TOKEN + "x"])
def test_http_refuses_missing_or_wrong_token(auth_server, marker, method, path, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    before = executions(marker)
    response = httpx.request(method, f"http://{auth_server.http_url}{path}", headers=headers,
                             content=INFER_BODY if method == "POST" else None)
    assert response.status_code == 401
    assert "authorization" in response.json()["error"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert executions(marker) == before


@pytest.mark.parametrize("authorization", [TOKEN, f"Bearer {TOKEN}", f"bearer {TOKEN}"])
def test_http_accepts_the_token(auth_server, marker, authorization):
    response = httpx.post(f"http://{auth_server.http_url}/v2/models/marker_python/infer",
                          headers={"Authorization": authorization}, content=INFER_BODY)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0]
    assert executions(marker) >= 1


def test_health_endpoints_are_exempt(auth_server):
    assert httpx.get(f"http://{auth_server.http_url}/v2/health/live").status_code == 200
    assert httpx.get(f"http://{auth_server.http_url}/v2/health/ready").status_code == 200


def test_tritonclient_http_with_and_without_headers(auth_server):
    client = httpclient.InferenceServerClient(auth_server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("marker_python")
    assert info.value.status() == "401"
    metadata = client.get_model_metadata("marker_python", headers={"Authorization": f"Bearer {TOKEN}"})
    assert metadata["name"] == "marker_python"
    client.close()


GRPC_CALLS = [
    ("ServerLive", service_pb2.ServerLiveRequest()),
    ("ServerReady", service_pb2.ServerReadyRequest()),
    ("ModelReady", service_pb2.ModelReadyRequest(name="marker_python")),
    ("ServerMetadata", service_pb2.ServerMetadataRequest()),
    ("ModelMetadata", service_pb2.ModelMetadataRequest(name="marker_python")),
    ("ModelConfig", service_pb2.ModelConfigRequest(name="marker_python")),
    ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="marker_python")),
    ("RepositoryIndex", service_pb2.RepositoryIndexRequest()),
    ("RepositoryModelLoad", service_pb2.RepositoryModelLoadRequest(model_name="marker_python")),
    ("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(model_name="marker_python")),
]


def _infer_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="marker_python")
    request.inputs.add(name="IN", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.ones(1, dtype=np.float32).tobytes())
    return request


@pytest.fixture(scope="module")
def stub(auth_server):
    channel = grpc.insecure_channel(auth_server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.mark.parametrize("metadata", [(), (("authorization", "wrong"),), (("authorization", f"Bearer {TOKEN}1"),)],
                         ids=["missing", "wrong", "bearer-wrong"])
def test_grpc_refuses_every_method_without_the_token(stub, marker, metadata):
    before = executions(marker)
    for method, request in [*GRPC_CALLS, ("ModelInfer", _infer_request())]:
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, method)(request, metadata=metadata, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
    with pytest.raises(grpc.RpcError) as info:
        list(stub.ModelStreamInfer(iter([_infer_request()]), metadata=metadata, timeout=10))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert executions(marker) == before


def test_grpc_accepts_the_token(stub, auth_server):
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    response, call = stub.ModelInfer.with_call(_infer_request(), metadata=metadata, timeout=10)
    assert call.code() == grpc.StatusCode.OK
    assert np.frombuffer(response.raw_output_contents[0], dtype=np.float32).tolist() == [1.0]
    streamed = list(stub.ModelStreamInfer(iter([_infer_request()]), metadata=metadata, timeout=10))
    assert streamed[0].error_message == ""
    client = grpcclient.InferenceServerClient(auth_server.grpc_url)
    assert client.is_server_ready(headers={"authorization": TOKEN})
    with pytest.raises(InferenceServerException) as info:
        client.is_server_ready()
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    client.close()


def test_no_token_logs_a_warning(server):
    assert "no auth token configured" in server.log()
