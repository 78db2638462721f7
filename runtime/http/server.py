"""The HTTP listener: granian (Rust, HTTP/1.1 and h2c on one port) embedded in our event loop.

Slow or silent clients cannot starve the server:

- the listening socket defers accept (``TCP_DEFER_ACCEPT``) until a client sends its first bytes,
  so connections that never speak never reach the server;
- request headers must arrive within ``header_timeout`` (on HTTP/1.1 keep-alive connections this
  is also the idle timeout between requests); HTTP/2 peers must answer pings;
- at most ``max_connections`` requests are served at once (granian's back-pressure); when connections near
  ``max_connections`` or the open-file limit, the oldest ones still sending their headers are closed
  (``shedding.py``), so that new clients get in;
- request bodies have a deadline of their own (enforced where bodies are read, see ``body.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings, HTTP2Settings
from granian.log import LogLevels
from granian.net import SocketHolder, SocketSpec
from granian.server.embed import Server as EmbeddedGranian
from starlette.types import ASGIApp

from runtime.http.limits import HttpLimits
from runtime.http.shedding import HeaderShedder

logger = logging.getLogger(__name__)


class _MessageFilter(logging.Filter):
    """Drops granian's start-up notice about its embedded mode (it is pinned and tested here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "experimental" not in record.getMessage()


def _granian_logging() -> dict:
    """Granian logs through our handlers (propagate to the root logger) instead of its own stdout ones."""
    logging.getLogger("_granian").addFilter(_MessageFilter())
    return {
        "formatters": {},
        "handlers": {},
        "loggers": {
            "_granian": {"level": "WARNING", "propagate": True},
            "granian.access": {"level": "WARNING", "propagate": True},
        },
    }


class _Granian(EmbeddedGranian):
    """Granian's embedded server on a listening socket made (or inherited) before it starts."""

    listener: SocketHolder

    def _init_shared_socket(self) -> None:
        self._shd = self.listener  # type: ignore[assignment]  # granian's stub types the holder as None
        self._sfd = self.listener.get_fd()
        self._ssp = None


def _defer_accept(fd: int, seconds: int) -> None:
    """Hand a connection to the server only once the client has sent data (Linux)."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or sys.platform != "linux":
        return
    listener = socket.socket(fileno=os.dup(fd))
    try:
        listener.setsockopt(socket.IPPROTO_TCP, option, seconds)
    except OSError as exc:
        logger.warning("cannot defer accept on the HTTP listener: %s", exc)
    finally:
        listener.close()


class HttpServer:
    """Serves an ASGI app on ``host:port`` until :meth:`stop`."""

    def __init__(self, app: ASGIApp, host: str, port: int, limits: HttpLimits | None = None,
                 listening_fd: int | None = None) -> None:
        """``listening_fd``: serve this listening socket (a front end's, in an SO_REUSEPORT group) instead of
        binding ``host:port``."""
        limits = limits or HttpLimits()
        self.address = f"{host}:{port}"
        self.shedder = HeaderShedder(port, limits.max_connections)
        self._listening_fd = listening_fd
        self._backlog = limits.backlog
        self._server = _Granian(
            self.shedder.wrap(app),
            address=host,
            port=port,
            interface=Interfaces.ASGINL,
            http=HTTPModes.auto,
            websockets=False,
            backlog=limits.backlog,
            backpressure=limits.max_connections,
            http1_settings=HTTP1Settings(header_read_timeout=int(limits.header_timeout * 1000)),
            http2_settings=HTTP2Settings(
                max_concurrent_streams=limits.max_concurrent_streams,
                keep_alive_interval=int(limits.ping_interval * 1000),
                keep_alive_timeout=max(1, int(limits.ping_interval)),
            ),
            log_level=LogLevels.warning,
            log_dictconfig=_granian_logging(),
        )
        self._task: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        """Bind and start serving; OSError if the address cannot be bound."""
        if self._listening_fd is not None:
            self._server.listener = SocketHolder(self._listening_fd, False, self._backlog)  # type: ignore[call-arg]
        else:
            check_bindable(self.address)
            host, _, port = self.address.rpartition(":")
            self._server.listener = SocketSpec(host, int(port), self._backlog).build()
        _defer_accept(self._server.listener.get_fd(), seconds=5)
        self._task = asyncio.create_task(self._server.serve())
        self._watch = asyncio.create_task(self.shedder.run())
        await asyncio.sleep(0)

    @property
    def task(self) -> asyncio.Task | None:
        return self._task

    async def stop(self, timeout: float) -> bool:
        """Stop accepting and let in-flight requests finish; False if some did not within ``timeout``."""
        if self._watch is not None:
            self._watch.cancel()
        if self._task is None:
            return True
        self._server.stop()
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            return False
        with contextlib.suppress(Exception):
            self._task.result()
        return True


def check_bindable(address: str, server: str = "HTTP") -> None:
    """Raise OSError naming the address if nothing could listen on it (granian would only log it)."""
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port)))
        except OSError as exc:
            raise OSError(f"cannot bind the {server} server to {address}: {exc.strerror}") from None
