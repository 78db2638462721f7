"""Our gRPC status codes are grpcio's, member for member (runtime/grpc/status_codes.py); that the front ends not on
grpcio leave it unimported is tests/test_protocol.py's start-up import test."""

from __future__ import annotations

import grpc

from runtime.grpc.status_codes import StatusCode, grpcio_code


def test_every_code_has_grpcios_name_and_value():
    assert [(code.name, code.value) for code in StatusCode] == [(code.name, code.value) for code in grpc.StatusCode]


def test_grpcio_code_gives_grpcios_own_member():
    for code in StatusCode:
        assert grpcio_code(code) is grpc.StatusCode[code.name]
    assert grpcio_code(grpc.StatusCode.NOT_FOUND) is grpc.StatusCode.NOT_FOUND

