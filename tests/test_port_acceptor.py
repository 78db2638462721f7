"""Which connections the one port hands whole to the native gRPC edge (``runtime/listen/port_acceptor.py``): those
that open as a client of grpc's C core does, checked against the bytes a real grpcio client sends."""

from __future__ import annotations

import socket
import threading

import grpc

from runtime.listen.port_acceptor import GRPC_CORE_SETTING, PREFACE, grpc_core_client, http2_client


def _settings_frame(pairs: list[tuple[int, int]]) -> bytes:
    payload = b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in pairs)
    return len(payload).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + payload


def _first_bytes_of_a_grpcio_client() -> bytes:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received = bytearray()

    def accept() -> None:
        connection, _ = listener.accept()
        connection.settimeout(2)
        try:
            while len(received) < 64:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                received.extend(chunk)
        except OSError:
            pass
        connection.close()

    thread = threading.Thread(target=accept)
    thread.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            pass
    thread.join(5)
    listener.close()
    return bytes(received)


def test_a_grpcio_client_is_one_of_grpc_core():
    assert grpc_core_client(_first_bytes_of_a_grpcio_client())


def test_what_else_a_connection_may_begin_with_goes_to_haproxy():
    core = PREFACE + _settings_frame([(2, 0), (GRPC_CORE_SETTING, 1)])
    assert grpc_core_client(core)
    assert not grpc_core_client(PREFACE + _settings_frame([(2, 0), (3, 100)]))  # another h2c client (Go's, a proxy)
    assert not grpc_core_client(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not grpc_core_client(core[:30])  # too little to tell
    assert not grpc_core_client(core[:-2])  # its SETTINGS frame not whole
    assert not grpc_core_client(PREFACE + b"\x00\x00\x06\x01" + bytes(5) + bytes(6))  # not a SETTINGS frame
    assert not grpc_core_client(b"")


def test_a_connection_without_the_http2_preface_is_http1_and_one_too_short_to_tell_is_not():
    assert not http2_client(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n\r\n")
    assert not http2_client(b"GET / HTTP/1.0\r\n\r\n")
    assert not http2_client(b"\x16\x03\x01\x02\x00")  # a TLS hello: refused by the HTTP/1.1 parser, not proxied
    assert http2_client(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    assert http2_client(PREFACE[:10])  # too little to tell: HAProxy speaks both
    assert http2_client(b"")
