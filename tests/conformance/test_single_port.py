"""Every gRPC conformance case against our server on one port (``--single-port true``: gRPC and REST on the HTTP
port, gRPC through hypercorn and the ASGI adapter instead of grpcio's server), judged against Triton's own answers
as the two-port suite judges them. Both servers start fresh for it: several cases read state earlier ones set."""

from __future__ import annotations

import pytest

from tests.conformance.cases import GRPC_CASES
from tests.conformance.conftest import CACHE_BYTES
from tests.conformance.harness import observe_grpc
from tests.conformance.servers import start_pair
from tests.conformance.test_conformance import judge


@pytest.fixture(scope="module")
def single_port_pair(repository, tmp_path_factory, pair):  # pair: the session's shared-memory regions exist
    servers = start_pair(repository, tmp_path_factory.mktemp("single-port"),
                         (f"--cache-config=local,size={CACHE_BYTES}",),
                         ("--cache-config", f"local,size={CACHE_BYTES}", "--single-port", "true"))
    yield servers
    servers.stop()


@pytest.mark.parametrize("case", GRPC_CASES, ids=lambda case: case.name)
def test_grpc_on_the_single_port(single_port_pair, case):
    judge(case.name, observe_grpc(single_port_pair.triton.grpc, case), observe_grpc(single_port_pair.ours.http,
                                                                                    case))
