"""A chunked HTTP body has at most 65,536 non-empty chunks (Triton 2.69, server #8770), Triton's
qa/L0_http/http_request_many_chunks.py ported: at the bound the request is read and answered on its merits, one
past it is refused 400 in Triton's words, and a million one-byte chunks, sent again and again, leave the server's
memory where it was. On two ports (granian) and on the one port (its HTTP/1.1 server)."""

from __future__ import annotations

import socket

import psutil
import pytest

from runtime.http.body import MAX_BODY_CHUNKS, TOO_MANY_CHUNKS
from tests.support import ServerProcess, write_add_sub_onnx

MODES = {"two ports": (), "one port": ("--single-port",)}
MIB = 1 << 20


@pytest.fixture(scope="module", params=list(MODES))
def server(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp("chunks") / "models"
    write_add_sub_onnx(repository, "add_sub")
    with ServerProcess(repository, *MODES[request.param]) as process:
        yield process


def _chunked(server: ServerProcess, chunks: int) -> tuple[int, str]:
    """A raw infer request whose body is ``chunks`` one-byte chunks; the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 0\r\n"
                     b"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n")
        try:
            sock.sendall(b"1\r\nA\r\n" * chunks + b"0\r\n\r\n")
        except OSError:  # refused and closed before all was sent: the answer is there to read
            pass
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def test_at_the_bound_the_request_is_read(server):
    status, body = _chunked(server, MAX_BODY_CHUNKS)
    assert status == 400
    assert "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs" in body


def test_one_past_the_bound_is_refused_in_triton_s_words(server):
    assert _chunked(server, MAX_BODY_CHUNKS + 1) == (400, '{"error":"' + TOO_MANY_CHUNKS + '"}')


def test_a_million_chunks_again_and_again_leave_memory_where_it_was(server):
    owner = psutil.Process(server.process.pid)
    for _ in range(2):  # warm: what the refusal path allocates once
        assert _chunked(server, 1_000_000)[1] == '{"error":"' + TOO_MANY_CHUNKS + '"}'
    before = owner.memory_info().rss
    for _ in range(4):
        assert _chunked(server, 1_000_000)[0] == 400
    assert owner.memory_info().rss - before < 8 * MIB
