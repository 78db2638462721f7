"""The one port's HTTP/1.1 server (``runtime/http/adopted.py``), in process: real loopback connections accepted here
and handed to it, as the port's acceptor does."""

from __future__ import annotations

import asyncio
import socket

import pytest

from runtime.http.adopted import COALESCE_BYTES, MAX_HEADER_BYTES, AdoptedHttp1, CoalescingTransport
from runtime.http.limits import HttpLimits


class _App:
    """Answers ``/hold`` once ``release`` is set, anything else at once, with the path as the body."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/hold":
            self.holding.set()
            await self.release.wait()
        answer = scope["path"].encode() + b" " + str(len(body)).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


_CLIENTS: list[asyncio.StreamWriter] = []  # each test's client connections, closed as it ends


async def _close_clients() -> None:
    for writer in _CLIENTS:
        writer.close()
    _CLIENTS.clear()
    await asyncio.sleep(0)


async def _pair(server: AdoptedHttp1) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection whose server end is handed to ``server``."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    connecting = asyncio.create_task(asyncio.open_connection(*listener.getsockname()))
    accepted, _ = await loop.sock_accept(listener)
    listener.close()
    server.adopt(accepted)
    reader, writer = await connecting
    _CLIENTS.append(writer)
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    return head.split(b"\r\n", 1)[0] + b" | " + await asyncio.wait_for(reader.readexactly(length), 5)


async def _closed(reader: asyncio.StreamReader, wait: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), wait) == b""
    except (TimeoutError, ConnectionError):
        return False


def _run(test, limits: HttpLimits | None = None):
    async def main():
        app = _App()
        server = AdoptedHttp1(app, limits or HttpLimits())
        try:
            await test(server, app)
        finally:
            app.release.set()
            await server.stop(2)
            await _close_clients()

    asyncio.run(main())


def test_keep_alive_pipelining_and_the_reason_phrase():
    async def test(server, app):
        reader, writer = await _pair(server)
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                     b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await _answer(reader) == b"HTTP/1.1 200 OK | /a 3"
        assert await _answer(reader) == b"HTTP/1.1 200 OK | /b 0"
        writer.write(b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await _answer(reader) == b"HTTP/1.1 200 OK | /c 0"
        writer.close()

    _run(test)


def test_headers_past_the_bound_get_431_and_the_connection_closes():
    async def test(server, app):
        reader, writer = await _pair(server)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * MAX_HEADER_BYTES + b"\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 431 ")
        await asyncio.wait_for(reader.read(), 5)
        reader2, writer2 = await _pair(server)  # many headers, each small, are counted together
        writer2.write(b"GET /a HTTP/1.1\r\n" + b"X-Small: 0123456789\r\n" * (MAX_HEADER_BYTES // 20) + b"\r\n")
        assert (await asyncio.wait_for(reader2.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 431 ")
        reader3, writer3 = await _pair(server)  # just under the bound is served
        writer3.write(b"GET /a HTTP/1.1\r\nX-Big: " + b"y" * (MAX_HEADER_BYTES - 100) + b"\r\n\r\n")
        assert await _answer(reader3) == b"HTTP/1.1 200 OK | /a 0"
        for each in (writer, writer2, writer3):
            each.close()

    _run(test)


def test_headers_that_trickle_are_cut_off_at_the_header_timeout_and_so_is_an_idle_connection():
    async def test(server, app):
        trickling, trickling_writer = await _pair(server)
        trickling_writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n")
        idle, idle_writer = await _pair(server)
        idle_writer.write(b"GET /a HTTP/1.1\r\n\r\n")
        assert await _answer(idle) == b"HTTP/1.1 200 OK | /a 0"
        assert await _closed(trickling, 3) and await _closed(idle, 3)

    _run(test, HttpLimits(header_timeout=1.0))


def test_past_max_connections_a_new_one_waits_and_the_oldest_silent_one_makes_room():
    async def test(server, app):
        silent = [await _pair(server) for _ in range(3)]
        for _, writer in silent:
            writer.write(b"GET /a HTTP/1.1\r\n")  # never completes its headers
        reader, writer = await _pair(server)
        writer.write(b"GET /new HTTP/1.1\r\n\r\n")
        assert await _answer(reader) == b"HTTP/1.1 200 OK | /new 0"  # once the oldest silent one was old enough
        assert server.shed_total >= 1
        assert await _closed(silent[0][0], 1)
        assert len(server.connections) <= 3

    _run(test, HttpLimits(max_connections=3))


def test_a_busy_connection_is_not_closed_to_make_room():
    async def test(server, app):
        busy, busy_writer = await _pair(server)
        busy_writer.write(b"GET /hold HTTP/1.1\r\n\r\n")
        await asyncio.wait_for(app.holding.wait(), 5)
        reader, writer = await _pair(server)
        writer.write(b"GET /new HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.6)  # past the age at which a connection still in its headers may be closed
        assert server.shed_total == 0 and len(server.waiting) == 1
        app.release.set()
        assert await _answer(busy) == b"HTTP/1.1 200 OK | /hold 0"
        busy_writer.close()  # its connection goes: the waiting one is served
        assert await _answer(reader) == b"HTTP/1.1 200 OK | /new 0"

    _run(test, HttpLimits(max_connections=1))


@pytest.mark.parametrize("finishes", [True, False])
def test_stop_lets_a_request_under_way_finish_and_closes_the_idle(finishes):
    async def main():
        app = _App()
        server = AdoptedHttp1(app, HttpLimits())
        busy, busy_writer = await _pair(server)
        busy_writer.write(b"GET /hold HTTP/1.1\r\n\r\n")
        idle, idle_writer = await _pair(server)
        idle_writer.write(b"GET /a HTTP/1.1\r\n\r\n")
        assert await _answer(idle) == b"HTTP/1.1 200 OK | /a 0"
        await asyncio.wait_for(app.holding.wait(), 5)
        stopping = asyncio.create_task(server.stop(1.0))
        assert await _closed(idle, 2)
        if finishes:
            app.release.set()
            assert await _answer(busy) == b"HTTP/1.1 200 OK | /hold 0"
        assert await stopping is finishes
        assert await _closed(busy, 2)
        late_reader, _ = await _pair(server)  # adopted after stop: closed at once
        assert await _closed(late_reader, 2)
        await _close_clients()

    asyncio.run(main())


class _Recorded(asyncio.Transport):
    """A transport that keeps what is written to it (to see what the wrapper hands it, and when)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def test_small_writes_of_one_loop_turn_go_together_and_large_ones_at_once():
    async def main():
        inner = _Recorded()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"body")
        assert inner.writes == []  # not yet: the rest of the turn may add to them
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        transport.write(b"head")
        transport.write(b"x" * COALESCE_BYTES)  # at once, after what waited: flow control sees it as it is written
        assert inner.writes[1:] == [b"head" + b"x" * COALESCE_BYTES]
        transport.write(b"last")
        transport.close()  # what waits goes first
        assert inner.writes[2:] == [b"last"] and inner.closed

    asyncio.run(main())
