"""Our gRPC status codes are grpcio's, member for member (runtime/grpc/status_codes.py), and the gRPC front ends that
do not run on grpcio leave it unimported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from runtime.grpc.status_codes import StatusCode, grpcio_code

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_has_grpcios_name_and_value():
    assert [(code.name, code.value) for code in StatusCode] == [(code.name, code.value) for code in grpc.StatusCode]


def test_grpcio_code_gives_grpcios_own_member():
    for code in StatusCode:
        assert grpcio_code(code) is grpc.StatusCode[code.name]
    assert grpcio_code(grpc.StatusCode.NOT_FOUND) is grpc.StatusCode.NOT_FOUND


def test_the_native_edge_and_the_one_ports_grpc_leave_grpcio_unimported():
    probe = ("import sys, runtime.adapters, runtime.grpc.server, runtime.grpc.native, runtime.grpc.asgi, "
             "runtime.listen.single_port; print('grpc' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
