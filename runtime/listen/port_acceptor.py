"""The one port's listening socket: each connection goes whole, by its first bytes, to the native gRPC edge, to this
process's HTTP/1.1 server or to HAProxy (``port_proxy.py``), which routes the others request by request.

A client of grpc's C core (tritonclient's gRPC client, grpcio's, grpc++'s) opens its connection with the HTTP/2
preface and a SETTINGS frame holding its own setting 0xFE03 (grpc_allow_true_binary_metadata), and such a channel
carries only gRPC calls: the edge takes it as a connection to its own port (``Edge.adopt_connection``), with nothing
between the client and the edge. A connection that does not open with the HTTP/2 preface (HTTP/1.1, which cannot
carry gRPC) is served in this process (``runtime/http/adopted.py``), again with nothing between. Another HTTP/2
connection (an h2c client of another kind, a platform's proxy multiplexing REST and gRPC streams on one connection)
is passed to HAProxy over a unix socket pair (``bind sockpair@``). The first bytes are read with MSG_PEEK once, at
accept (the listener defers accepting until the client has sent something), so nothing is consumed; a connection
that has sent too little to tell goes to HAProxy, which is right for any client.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = 9
SETTINGS_FRAME = 4
GRPC_CORE_SETTING = 0xFE03  # grpc_allow_true_binary_metadata, which only grpc's C core sends
PEEK_BYTES = 512  # the preface and a SETTINGS frame of up to 80 settings
DEFER_ACCEPT_SECONDS = 5
PAUSE_SECONDS = 0.1  # between tries to accept once descriptors have run out
WARN_EVERY_SECONDS = 10.0  # at most one warning that the port cannot accept in this time


def http2_client(first_bytes: bytes) -> bool:
    """Whether a connection that began with ``first_bytes`` may be an HTTP/2 one (or has sent too little to
    tell)."""
    return PREFACE.startswith(first_bytes[:len(PREFACE)])


def grpc_core_client(first_bytes: bytes) -> bool:
    """Whether a connection that began with ``first_bytes`` is a gRPC channel of grpc's C core: the HTTP/2 preface,
    then a SETTINGS frame (whole in ``first_bytes``) holding the setting 0xFE03."""
    if not first_bytes.startswith(PREFACE) or len(first_bytes) < len(PREFACE) + FRAME_HEADER:
        return False
    header = first_bytes[len(PREFACE):len(PREFACE) + FRAME_HEADER]
    length, kind, stream = int.from_bytes(header[:3], "big"), header[3], int.from_bytes(header[5:9], "big")
    start = len(PREFACE) + FRAME_HEADER
    if kind != SETTINGS_FRAME or stream != 0 or length % 6 or len(first_bytes) < start + length:
        return False
    payload = first_bytes[start:start + length]
    return any(int.from_bytes(payload[i:i + 2], "big") == GRPC_CORE_SETTING for i in range(0, length, 6))


class PortAcceptor:
    """Accepts on ``listener`` and hands each connection to ``adopt_grpc`` (the native edge: it takes the
    descriptor and says True) when ``grpc_core_client``, to ``adopt_http1`` (it takes the socket) when not
    ``http2_client``, else to HAProxy's end of ``proxy_channel`` (see the module). Event loop only."""

    def __init__(self, listener: socket.socket, adopt_grpc: Callable[[int], bool] | None,
                 adopt_http1: Callable[[socket.socket], None], proxy_channel: socket.socket,
                 out_of_descriptors: Callable[[], None] | None = None) -> None:
        """``out_of_descriptors``: called when an accept fails for want of a descriptor (to close idle ones)."""
        self.out_of_descriptors = out_of_descriptors
        self.listener = listener
        self.adopt_grpc = adopt_grpc
        self.adopt_http1 = adopt_http1
        self.proxy_channel = proxy_channel
        self.to_edge = self.to_http1 = self.to_proxy = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: asyncio.TimerHandle | None = None
        self._warned_at = -WARN_EVERY_SECONDS

    def start(self) -> None:
        self.listener.setblocking(False)
        with contextlib.suppress(OSError, AttributeError):  # Linux: accepted only once the client has sent data
            self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_SECONDS)
        self.proxy_channel.settimeout(1.0)  # HAProxy reads it at once; a stuck one does not stall the loop
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.listener.fileno(), self._accept)

    def stop(self) -> None:
        """Accept nothing more (the connections in the backlog are refused with the listener)."""
        if self._paused is not None:
            self._paused.cancel()
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self.listener.fileno())
        self.listener.close()
        self.proxy_channel.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the backlog holds the rest until one is free
                now = time.monotonic()
                if now - self._warned_at >= WARN_EVERY_SECONDS:  # not every pause: ten a second
                    self._warned_at = now
                    logger.warning("the port cannot accept a connection now: %s", exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self.out_of_descriptors is not None:
                    self.out_of_descriptors()
                self._pause()
                return
            self._hand_on(connection)

    def _pause(self) -> None:
        """Stop watching the listener for ``PAUSE_SECONDS`` (it stays readable: watched, the loop would spin)."""
        assert self._loop is not None
        self._loop.remove_reader(self.listener.fileno())
        self._paused = self._loop.call_later(PAUSE_SECONDS, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._loop is not None and self.listener.fileno() >= 0:
            self._loop.add_reader(self.listener.fileno(), self._accept)

    def _hand_on(self, connection: socket.socket) -> None:
        """To the edge, the HTTP/1.1 server or HAProxy, by what the connection has sent so far (with
        TCP_DEFER_ACCEPT, its first segment: a grpc client sends the preface and its SETTINGS in one), left
        unread."""
        try:
            first = connection.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            first = b""
        except OSError:
            connection.close()
            return
        # as grpc and granian set on the sockets they accept (HAProxy does not, and an answer's last segment would
        # wait for the client's delayed ACK: HTTP/1.1 answers of 600 KB took 16 ms instead of 4)
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.adopt_grpc is not None and grpc_core_client(first):
            connection.setblocking(False)  # grpc reads until EAGAIN: a blocking socket would hang its poller
            if self.adopt_grpc(connection.detach()):  # the edge owns (and closes) it from here
                self.to_edge += 1
            return
        if not http2_client(first):
            self.to_http1 += 1
            self.adopt_http1(connection)  # which owns (and closes) it from here
            return
        try:
            socket.send_fds(self.proxy_channel, [b"\0"], [connection.fileno()])
            self.to_proxy += 1
        except OSError as exc:
            logger.warning("a connection could not be handed to haproxy: %s", exc)
        finally:
            connection.close()  # HAProxy holds its own descriptor of it now
