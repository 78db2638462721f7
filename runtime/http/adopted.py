"""HTTP/1.1 connections accepted elsewhere, served whole in this event loop: the one port's acceptor
(``runtime/listen/port_acceptor.py``) hands over each connection that does not open as HTTP/2.

Granian, the two-port mode's listener, serves only a listening socket of its own, so these connections would have
to be relayed to it through a proxy; through HAProxy a 600 KB request at concurrency 1 cost about 1000 µs more CPU
and ran at 0.65-0.8x the two ports' rate (docs/benchmarks.md, "HTTP/1.1 on the one port"). Here httptools' parser
(llhttp, C) reads them through uvicorn's protocol on the server's own loop (``loop.connect_accepted_socket``), with
nothing between the client and the application; the same application as on the two ports, at about granian's cost
(the same page, "uvicorn ... measured").

uvicorn's server is not used, only its protocol; the bounds granian keeps on the two ports are kept here:

- a request's headers must arrive within ``header_timeout`` (a connection that trickles them is closed), and they
  may hold at most ``MAX_HEADER_BYTES`` (431 beyond); an idle keep-alive connection is closed after the same time;
- at most ``max_connections`` connections are served at once; past that a new one waits (unread) for room, which
  is made by closing the oldest connections that never completed a request's headers and are ``MIN_AGE_SECONDS``
  old (as ``shedding.py`` does for granian on the two ports); those served keep ``FD_RESERVE`` descriptors of the
  open-file limit free for models, files and pipes, and waiting ones may take half of that (one past it is
  closed); where the port cannot accept for want of descriptors, the oldest of those still in their headers are
  closed too;
- bodies and answers keep the application's own deadlines and bounds (``body.py``, ``sending.py``);
- :meth:`AdoptedHttp1.stop` closes idle connections, lets the requests under way finish (their connections close
  after the answer), then closes what is left.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections import deque

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from runtime.http.body import MAX_BODY_CHUNKS, TOO_MANY_CHUNKS
from runtime.http.limits import HttpLimits
from runtime.http.status import error_body

logger = logging.getLogger(__name__)

COALESCE_BYTES = 64 * 1024  # writes smaller than this wait for the rest of the loop turn's (see CoalescingTransport)
MAX_HEADER_BYTES = 64 * 1024  # a request's line and headers, counted as they are parsed (431 beyond)
FD_RESERVE = 64
MIN_AGE_SECONDS = 0.4
HEADERS_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                     b"content-length: 32\r\nconnection: close\r\n\r\nrequest header fields too large\n")


_TOO_MANY_CHUNKS_BODY = error_body(TOO_MANY_CHUNKS)
TOO_MANY_CHUNKS_ANSWER = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: "
                          + str(len(_TOO_MANY_CHUNKS_BODY)).encode() + b"\r\nconnection: close\r\n\r\n"
                          + _TOO_MANY_CHUNKS_BODY)


class CoalescingTransport:
    """The connection's transport with the small writes of one loop turn sent together: uvicorn writes an answer's
    head and its body separately, two ``send`` calls and two TCP segments where granian sends one (HTTP
    add_sub_onnx at c=32 on the one port: about 10 µs less server CPU a request, docs/benchmarks.md). Writes that
    reach ``COALESCE_BYTES`` go at once, with what waits before them, so that the transport's flow control (a
    client that stops reading pauses the answer's sender: ``sending.py``'s deadline) sees them as before.
    Everything but ``write`` and ``close`` is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, data: bytes) -> None:
        if self._pending_bytes + len(data) >= COALESCE_BYTES:
            self._pending.append(data)
            self.flush()
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)
        self._pending_bytes += len(data)

    def flush(self) -> None:
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class BoundedHttp1Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size bound on each request's headers."""

    owner: AdoptedHttp1

    def __init__(self, owner: AdoptedHttp1, config: uvicorn.Config, state: ServerState,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(config, state, {}, loop)
        self.owner = owner
        self.adopted_at = time.monotonic()
        self.requests_begun = 0
        self.header_bytes = 0
        self.headers_too_large = False
        self.chunks = 0  # chunk headers of the request being read (a chunked body's, its last empty one too)
        self.too_many_chunks = False
        self.in_headers = False  # a request begun whose headers are not all here
        self.header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._await_headers()  # the first request's

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        self.owner.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """The deadline is set only where a request's headers are still incomplete once its bytes so far are
        parsed: most requests come whole in one read and need no timer."""
        super().data_received(data)
        if self.in_headers and self.header_deadline is None:
            self._await_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.header_bytes = 0
        self.chunks = 0
        self.in_headers = True

    def on_chunk_header(self) -> None:
        """At most MAX_BODY_CHUNKS non-empty chunks, as Triton 2.69 (the parser stops; send_400_response answers in
        Triton's words).  httptools hands over a read's chunks together, so this bounds work, not memory."""
        self.chunks += 1
        if self.chunks > MAX_BODY_CHUNKS + 1:  # the last, empty chunk has a header too
            self.too_many_chunks = True
            raise ValueError("too many chunks")

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_headers = False
        self._headers_arrived()
        self.requests_begun += 1
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        """The parser's refusal: 431 where the headers were too large (``_count_header_bytes`` stopped it)."""
        if self.headers_too_large:
            self.transport.write(HEADERS_TOO_LARGE)
            self.transport.close()
        elif self.too_many_chunks:
            self.transport.write(TOO_MANY_CHUNKS_ANSWER)
            self.transport.close()
        else:
            super().send_400_response(msg)

    def _count_header_bytes(self, count: int) -> None:
        self.header_bytes += count
        if self.header_bytes > MAX_HEADER_BYTES:
            self.headers_too_large = True
            raise ValueError("request headers too large")  # the parser stops; send_400_response answers

    def _await_headers(self) -> None:
        if self.header_deadline is None and self.transport is not None and not self.transport.is_closing():
            self.header_deadline = self.loop.call_later(self.owner.limits.header_timeout, self._headers_too_slow)

    def _headers_arrived(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def _headers_too_slow(self) -> None:
        self.header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class AdoptedHttp1:
    """Serves ``app`` on the HTTP/1.1 connections given to :meth:`adopt` (see the module). Event loop only."""

    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.limits = limits
        self.config = uvicorn.Config(app, interface="asgi3", lifespan="off", ws="none", log_config=None,
                                     access_log=False, proxy_headers=False, server_header=False,
                                     date_header=False, timeout_keep_alive=max(1, int(limits.header_timeout)))
        self.config.load()
        # uvicorn warns of every malformed request, which a client could make into a flood of lines; the client is
        # answered 400 either way, and the application's own errors are still logged
        logging.getLogger("uvicorn.error").setLevel(logging.ERROR)
        self.state = ServerState()
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        fd_limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
        # connections served at once, and served and waiting together: waiting ones get half of the reserve, so
        # that one can wait while the oldest silent connections age enough to be closed for it
        self.served_cap = max(1, min(limits.max_connections, fd_limit - FD_RESERVE))
        self.held_cap = max(self.served_cap + 1, fd_limit - FD_RESERVE // 2)
        self.connections: dict[BoundedHttp1Protocol, None] = {}  # served now, in the order they came
        self.waiting: deque[tuple[float, socket.socket]] = deque()  # past served_cap, the oldest first
        self.shed_total = 0
        self._retry: asyncio.TimerHandle | None = None
        self._stopping = False

    def adopt(self, connection: socket.socket) -> None:
        """Serve ``connection`` (a connected TCP socket, now this object's to close) now or, past
        ``max_connections``, once there is room."""
        if self._stopping:
            connection.close()
            return
        self.waiting.append((time.monotonic(), connection))
        self._admit()

    def closed(self, protocol: BoundedHttp1Protocol) -> None:
        self.connections.pop(protocol, None)
        if self.waiting and not self._stopping:
            self._admit()

    def _admit(self) -> None:
        """Serve the waiting connections there is room for, making room by closing the oldest connections that
        never completed a request's headers; drop the waiting ones past their header timeout or past the
        descriptors there are; look again soon while some wait."""
        now = time.monotonic()
        while self.waiting and now - self.waiting[0][0] >= self.limits.header_timeout:
            self.waiting.popleft()[1].close()
        if self.waiting and len(self.connections) >= self.served_cap:
            self._shed(min(len(self.waiting), len(self.connections) - self.served_cap + len(self.waiting)), now)
        while self.waiting and len(self.connections) < self.served_cap:
            self._serve(self.waiting.popleft()[1])
        while self.waiting and len(self.connections) + len(self.waiting) > self.held_cap:
            self.waiting.pop()[1].close()  # no descriptor to spare for it: as a full backlog would
        if self.waiting and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(MIN_AGE_SECONDS / 4, self._retry_admit)

    def out_of_descriptors(self) -> None:
        """The port could not accept (no descriptor left, the rest of the process holding more than the reserve):
        close the oldest connections still sending their first headers, a sixteenth of those served at most."""
        self._shed(max(8, self.served_cap // 16), time.monotonic())

    def _retry_admit(self) -> None:
        self._retry = None
        if not self._stopping:
            self._admit()

    def _serve(self, connection: socket.socket) -> None:
        connection.setblocking(False)
        loop = asyncio.get_running_loop()
        protocol = BoundedHttp1Protocol(self, self.config, self.state, loop)
        self.connections[protocol] = None  # counted at once: connection_made comes a loop turn later
        task = loop.create_task(loop.connect_accepted_socket(lambda: protocol, connection))
        task.add_done_callback(lambda done: self._not_served(done, protocol, connection))

    def _not_served(self, task: asyncio.Task, protocol: BoundedHttp1Protocol, connection: socket.socket) -> None:
        if task.cancelled() or task.exception() is not None:
            logger.warning("an HTTP/1.1 connection could not be served: %s",
                           "cancelled" if task.cancelled() else task.exception())
            connection.close()
            self.closed(protocol)

    def _shed(self, wanted: int, now: float) -> None:
        """Close up to ``wanted`` of the oldest connections still sending their first request's headers."""
        victims = [c for c in self.connections if not c.requests_begun and c.transport is not None
                   and now - c.adopted_at >= MIN_AGE_SECONDS][:max(0, wanted)]
        for protocol in victims:
            self.connections.pop(protocol, None)
            protocol.transport.close()
        if victims:
            self.shed_total += len(victims)
            logger.warning("%d HTTP/1.1 connections on the port (at most %d at once), %d waiting: closed the %d "
                           "oldest still sending their headers", len(self.connections) + len(victims),
                           self.served_cap, len(self.waiting), len(victims))

    async def stop(self, timeout: float) -> bool:
        """Adopt nothing more, close the idle and waiting connections, let the requests under way finish for
        ``timeout`` seconds; False if some had not (their connections are closed then)."""
        self._stopping = True
        if self._retry is not None:
            self._retry.cancel()
        while self.waiting:
            self.waiting.popleft()[1].close()
        for protocol in list(self.connections):
            if protocol.transport is not None:
                protocol.shutdown()
        deadline = time.monotonic() + timeout
        while (self.connections or self.state.tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        clean = not self.state.tasks
        for protocol in list(self.connections):
            if protocol.transport is not None:
                protocol.transport.close()
        for task in list(self.state.tasks):
            task.cancel()
        return clean
