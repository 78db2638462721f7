"""One listener for HTTP/1.1, h2c REST and gRPC, as serverless platforms give a function one port, in pure Python:
the fallback where HAProxy is not installed, and for front-end processes (the port is otherwise carried by
``port_acceptor.py`` and ``port_proxy.py`` to the two-port mode's own listeners).

Routing is per request (per HTTP/2 stream), by content type, because a platform's proxy (Knative's queue-proxy)
may carry a client's REST and gRPC streams on one connection: ``application/grpc`` goes to the gRPC adapter over
ASGI (``runtime/grpc/asgi.py``), everything else to the REST app. The listener is hypercorn: the HTTP/2 server for
ASGI that sends response trailers, which gRPC's status needs (granian, the two-port mode's HTTP listener, has no
trailers); docs/benchmarks.md measures what that costs against the two ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable

from runtime.http.limits import HttpLimits
from runtime.http.server import check_bindable

logger = logging.getLogger(__name__)

ASGIApp = Callable  # (scope, receive, send) -> awaitable


def route_by_content_type(rest: ASGIApp, grpc_app: ASGIApp) -> ASGIApp:
    """An ASGI app sending each gRPC call (HTTP/2, ``content-type: application/grpc...``) to ``grpc_app``."""

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope.get("http_version") == "2":
            for key, value in scope["headers"]:
                if key == b"content-type":
                    if value.startswith(b"application/grpc"):
                        await grpc_app(scope, receive, send)
                        return
                    break
        elif scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await rest(scope, receive, send)

    return app


async def _lifespan(receive: Callable, send: Callable) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class SinglePortServer:
    """Serves ``app`` (REST and gRPC routed) on ``host:port`` until :meth:`stop`; a front end passes its
    SO_REUSEPORT socket as ``listening_fd``."""

    def __init__(self, app: ASGIApp, host: str, port: int, limits: HttpLimits | None = None,
                 listening_fd: int | None = None) -> None:
        from hypercorn.config import Config

        limits = limits or HttpLimits()
        self.app = app
        self.address = f"{host}:{port}"
        self.limits = limits
        self.listening_fd = listening_fd
        self.config = Config()
        self.config.keep_alive_timeout = limits.header_timeout
        self.config.read_timeout = limits.header_timeout  # type: ignore[assignment]  # hypercorn reads seconds
        self.config.h2_max_concurrent_streams = limits.max_concurrent_streams
        # hypercorn closes a connection after 1,000 requests; gRPC clients keep one connection for everything, and
        # over HTTP/2 the close raced the frames already on their way, so h2 answered them with GOAWAY
        # PROTOCOL_ERROR and every call in flight on it failed (1 call in 60 at c=32). No per-connection limit, as
        # Triton (grpc) and the two-port mode have none.
        self.config.keep_alive_max_requests = sys.maxsize
        self.config.backlog = limits.backlog
        self.config.include_server_header = False
        self.config.accesslog = None
        self.config.errorlog = logging.getLogger("hypercorn.error")
        self._stopping = asyncio.Event()
        self._socket: socket.socket | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Bind (OSError if the address cannot be) and start serving."""
        from hypercorn.asyncio import serve

        if self.listening_fd is None:
            check_bindable(self.address)
            host, _, port = self.address.rpartition(":")
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.socket(family, socket.SOCK_STREAM)
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host.strip("[]"), int(port)))
            self._socket.listen(self.limits.backlog)
            fd = self._socket.fileno()
        else:
            fd = self.listening_fd
        self.config.bind = [f"fd://{fd}"]
        self._task = asyncio.create_task(serve(self.app, self.config, shutdown_trigger=self._stopping.wait))
        await asyncio.sleep(0)

    @property
    def task(self) -> asyncio.Task | None:
        return self._task

    async def stop(self, timeout: float) -> bool:
        """Stop accepting and let in-flight requests finish; False if some did not within ``timeout``."""
        if self._task is None:
            return True
        self.config.graceful_timeout = timeout
        self._stopping.set()
        done, _ = await asyncio.wait({self._task}, timeout=timeout + 1)
        clean = bool(done)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._socket is not None:
            self._socket.close()
        return clean
