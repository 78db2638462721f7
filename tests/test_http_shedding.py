"""The connection watch (runtime/http/shedding.py) in process, over real loopback sockets accepted here."""

from __future__ import annotations

import socket
import time

import pytest

from runtime.http.shedding import HeaderShedder


@pytest.fixture
def accepted():
    """A listener with 20 accepted connections: (listener, clients, server sides in the order they came)."""
    listener = socket.create_server(("127.0.0.1", 0))
    clients, servers = [], []
    for _ in range(20):
        clients.append(socket.create_connection(listener.getsockname()))
        servers.append(listener.accept()[0])
    yield listener, clients, servers
    for sock in clients + servers + [listener]:
        sock.close()


def _shut(client: socket.socket) -> bool:
    client.settimeout(0.05)
    try:
        return client.recv(1) == b""
    except TimeoutError:
        return False


def test_the_oldest_connections_that_never_sent_a_request_are_closed(accepted):
    listener, clients, _ = accepted
    watch = HeaderShedder(listener.getsockname()[1], max_connections=24)  # headroom 8: room for 16 connections
    assert watch.open()
    try:
        for client in clients[:3]:  # these three have sent a request
            watch.served[client.getsockname()[1]] = time.monotonic()
        watch.check()  # first sight: nothing is old enough yet
        assert not any(_shut(client) for client in clients)
        watch.min_age = 0.0
        watch.check()
        shut = [_shut(client) for client in clients]
        assert sum(shut) == 20 - 16 and not any(shut[:3])  # four closed, none that had sent a request
        assert watch.shed_total == 4
    finally:
        watch.close()


def test_below_the_cap_nothing_is_closed(accepted):
    listener, clients, _ = accepted
    watch = HeaderShedder(listener.getsockname()[1], max_connections=10_000)
    assert watch.open()
    watch.min_age = 0.0
    try:
        watch.check()
        assert watch.shed_total == 0 and not any(_shut(client) for client in clients)
    finally:
        watch.close()
