"""A front-end process: the HTTP and gRPC adapters over :class:`RemoteService`, until SIGTERM, then drained.

Started by :class:`runtime.frontends.pool.FrontEndPool` as ``python -m runtime.frontends.process LINK CONTROL``
with those two descriptors inherited; its settings arrive first on CONTROL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import sys

from runtime.auth import TokenAuth
from runtime.frontends.pool import HEARTBEAT_INTERVAL, FrontEndSettings
from runtime.frontends.remote import RemoteService
from runtime.frontends.wire import receive_blocking
from runtime.http.app import create_http_app
from runtime.http.server import HttpServer

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """Linux: this process gets SIGTERM when the owner dies (no front end outlives its models)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def reuse_port_listener(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket in ``host:port``'s SO_REUSEPORT group (the owner holds the port in that group)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host.strip("[]"), port))
    listener.listen(backlog)
    listener.setblocking(False)
    return listener


async def serve(link: socket.socket, control: socket.socket) -> int:
    settings: FrontEndSettings = receive_blocking(control)
    logging.getLogger().setLevel(settings.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    service = RemoteService(link, control, on_lost=stop.set)
    await service.connect()
    auth = TokenAuth(settings.auth_token) if settings.auth_token else None
    http: HttpServer | None = None
    grpc_server = None
    try:
        if settings.grpc_port is not None:
            from runtime.grpc.server import create_grpc_server

            grpc_server = create_grpc_server(service, f"{settings.host}:{settings.grpc_port}",
                                             settings.grpc_max_message_bytes, auth, settings.grpc_limits,
                                             reuse_port=True, restrictions=settings.grpc_restrictions)
            await grpc_server.start()
        if settings.http_port is not None:
            app = create_http_app(service, settings.max_request_bytes, auth, settings.auth_exempt_health,
                                  settings.http_limits.body_timeout, settings.json_decode_budget,
                                  settings.http_limits.unsent_bytes(), settings.http_restrictions)
            listener = reuse_port_listener(settings.host, settings.http_port, settings.http_limits.backlog)
            http = HttpServer(app, settings.host, settings.http_port, settings.http_limits,
                              listening_fd=listener.detach())
            await http.start()
    except OSError as exc:
        service.started(f"front end {settings.index}: {exc}")
        await service.close()
        return 1
    service.started(None)
    heartbeat = asyncio.create_task(service.beat(HEARTBEAT_INTERVAL))
    waits = [asyncio.create_task(stop.wait())] + ([http.task] if http is not None and http.task else [])
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    heartbeat.cancel()
    service.begin_shutdown()
    timeout = settings.shutdown_timeout
    stops = [http.stop(timeout)] if http is not None else []
    if grpc_server is not None:
        stops.append(grpc_server.stop(timeout))
    await asyncio.gather(*stops, return_exceptions=True)
    await service.close()
    return 0


def main(argv: list[str]) -> int:
    _end_with_parent()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s[front end]: %(message)s", stream=sys.stderr)
    link = socket.socket(fileno=int(argv[0]))
    control = socket.socket(fileno=int(argv[1]))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(link, control))
    return uvloop.run(serve(link, control))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
