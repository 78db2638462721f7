"""Endpoint restrictions (``--http-restricted-api``, ``--grpc-restricted-protocol``) against real Triton: every API
group but health behind a key of its own (health stays open, so that both servers can be seen to start), each
endpoint called without its header, with it, and with a wrong value."""

from __future__ import annotations

import httpx
import pytest
from tritonclient.grpc import service_pb2

from tests.conformance.cases import add_sub, grpc_add_sub
from tests.conformance.harness import GrpcCase, HttpCase, agree, observe_grpc, observe_http, without_traceback
from tests.conformance.servers import Pair, start_pair

GROUPS = ("metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace",
          "logging")
FLAGS = tuple(flag for group in GROUPS for flag in (f"--http-restricted-api={group}:k-{group}=v",
                                                    f"--grpc-restricted-protocol={group}:k-{group}=v"))
HTTP_CALLS = [
    ("GET", "/v2/health/ready", None, "health"), ("GET", "/v2", None, "metadata"),
    ("GET", "/v2/models/add_sub", None, "metadata"), ("GET", "/v2/models/nonexistent", None, "metadata"),
    ("GET", "/v2/models/add_sub/versions/1", None, "metadata"), ("GET", "/v2/models/add_sub/ready", None, "health"),
    ("POST", "/v2/models/add_sub/infer", add_sub(), "inference"), ("PUT", "/v2/models/add_sub/infer", None,
                                                                    "inference"),
    ("GET", "/v2/models/add_sub/config", None, "model-config"), ("POST", "/v2/repository/index", None,
                                                                  "model-repository"),
    ("GET", "/v2/models/stats", None, "statistics"), ("GET", "/v2/models/add_sub/stats", None, "statistics"),
    ("GET", "/v2/logging", None, "logging"), ("GET", "/v2/systemsharedmemory/status", None, "shared-memory"),
    ("POST", "/v2/cudasharedmemory/unregister", None, "shared-memory"), ("GET", "/v2/nothing", None, None),
]
GRPC_CALLS = [
    ("ServerReady", service_pb2.ServerReadyRequest(), "health"),
    ("ServerMetadata", service_pb2.ServerMetadataRequest(), "metadata"),
    ("ModelMetadata", service_pb2.ModelMetadataRequest(name="add_sub"), "metadata"),
    ("ModelInfer", grpc_add_sub(), "inference"),
    ("ModelStreamInfer", [grpc_add_sub()], "inference"),
    ("ModelConfig", service_pb2.ModelConfigRequest(name="add_sub"), "model-config"),
    ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="add_sub"), "statistics"),
    ("RepositoryIndex", service_pb2.RepositoryIndexRequest(), "model-repository"),
    ("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest(), "shared-memory"),
    ("CudaSharedMemoryUnregister", service_pb2.CudaSharedMemoryUnregisterRequest(), "shared-memory"),
    ("LogSettings", service_pb2.LogSettingsRequest(), "logging"),
]
HEADERS = {"none": {}, "right": "v", "wrong": "w"}


@pytest.fixture(scope="module")
def restricted_pair(repository, tmp_path_factory) -> Pair:
    servers = start_pair(repository, tmp_path_factory.mktemp("restricted"), FLAGS, FLAGS)
    yield servers
    servers.stop()


def _refusal(observed: dict) -> dict:
    """What a restriction decides: the status, and the words of a refusal (what a call let through answers is
    compared by the main suite, with its listed differences)."""
    if observed.get("status") == 403 or observed.get("code") == "UNAVAILABLE":
        return observed
    return {"status": observed.get("status"), "code": observed.get("code")}


def _judge(theirs: dict, ours: dict) -> None:
    theirs, ours = _refusal(without_traceback(theirs)), _refusal(ours)
    assert agree(theirs, ours), f"\ntriton: {theirs}\nours:   {ours}"


@pytest.mark.parametrize("header", list(HEADERS))
@pytest.mark.parametrize(("method", "path", "body", "group"), HTTP_CALLS, ids=[f"{c[0]} {c[1]}" for c in HTTP_CALLS])
def test_http_restricted_api(restricted_pair, method, path, body, group, header):
    headers = {f"K-{group.upper()}": HEADERS[header]} if group and header != "none" else {}
    case = HttpCase(f"restricted {method} {path}", method, path, body, headers)
    with httpx.Client(timeout=30) as client:
        _judge(observe_http(restricted_pair.triton.http, case, client),
               observe_http(restricted_pair.ours.http, case, client))


@pytest.mark.parametrize("header", list(HEADERS))
@pytest.mark.parametrize(("rpc", "request_message", "group"), GRPC_CALLS, ids=[c[0] for c in GRPC_CALLS])
def test_grpc_restricted_protocol(restricted_pair, rpc, request_message, group, header):
    metadata = ((f"triton-grpc-protocol-k-{group}", HEADERS[header]),) if header != "none" else ()
    case = GrpcCase(f"restricted {rpc}", rpc, request_message, metadata=metadata)
    _judge(observe_grpc(restricted_pair.triton.grpc, case), observe_grpc(restricted_pair.ours.grpc, case))
