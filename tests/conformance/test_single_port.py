"""Every gRPC conformance case against our server on one port (``--single-port true``: gRPC and REST on the HTTP
port, gRPC through hypercorn and the ASGI adapter instead of grpcio's server), judged against Triton's own answers
as the two-port suite judges them."""

from __future__ import annotations

import shutil

import pytest

from tests.conformance.cases import GRPC_CASES
from tests.conformance.conftest import CACHE_BYTES
from tests.conformance.harness import observe_grpc
from tests.conformance.test_conformance import judge
from tests.support import ServerProcess


@pytest.fixture(scope="module")
def single_port(repository, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("single-port")
    models = workdir / "models"
    shutil.copytree(repository, models)
    server = ServerProcess(models, "--cache-config", f"local,size={CACHE_BYTES}", "--single-port", "true",
                           log=workdir / "ours.log", strict=True)
    server.start(wait_ready=False)
    server.wait_for("/v2/health/live")
    server.wait_loaded()
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("case", GRPC_CASES, ids=lambda case: case.name)
def test_grpc_on_the_single_port(pair, single_port, case):
    judge(case.name, observe_grpc(pair.triton.grpc, case), observe_grpc(single_port.http_url, case))
