"""The protocol adapters over one core, started and stopped together: the HTTP app on its listener and the gRPC
server. Written once for both places that serve them: the process owning the models (``server.py``) and each
front-end process (``frontends/process.py``), which differ only in the service they hand in (the core, or the
core's remote proxy) and in sharing their ports with SO_REUSEPORT."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.adapter_settings import AdapterSettings
from runtime.api import InferenceApi
from runtime.auth import TokenAuth
from runtime.grpc.limits import MAX_DETAILS_BYTES
from runtime.header_forward import header_forward
from runtime.http.app import create_http_app
from runtime.http.sending import UnsentBytes
from runtime.http.server import HttpServer, check_bindable
from runtime.native.lanes import NativeLanes, open_lanes
from runtime.openai.restrictions import restriction_guard
from runtime.openai.routes import openai_mounts

if TYPE_CHECKING:
    from runtime.http.adopted import AdoptedHttp1
    from runtime.listen.port_acceptor import PortAcceptor
    from runtime.listen.port_proxy import PortProxy
    from runtime.listen.single_port import SinglePortServer

logger = logging.getLogger(__name__)


def _listening_socket(host: str, port: int, backlog: int, option: int = socket.SO_REUSEADDR) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port), with the socket option ``option`` set."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, option, 1)
    listener.bind((host.strip("[]"), port))
    listener.listen(backlog)
    return listener


def reuse_port_listener(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket in ``host:port``'s SO_REUSEPORT group (the owner holds the port in that group)."""
    listener = _listening_socket(host, port, backlog, socket.SO_REUSEPORT)
    listener.setblocking(False)
    return listener


class ProtocolAdapters:
    """The gRPC server and the HTTP listener over ``service``, for the ports ``settings`` names."""

    def __init__(self, service: InferenceApi, settings: AdapterSettings, reuse_port: bool = False,
                 direct_paths: bool = True) -> None:
        """``direct_paths``: whether ``service`` may offer direct paths, which the lanes then serve (a front-end
        process's remote core offers none)."""
        self.service = service
        self.settings = settings
        self.reuse_port = reuse_port
        self.direct_paths = direct_paths
        self.lanes: NativeLanes | None = None  # the lanes both adapters hand plain requests to
        self.http: HttpServer | SinglePortServer | None = None
        self.grpc: Any = None  # ThreadedGrpcServer or grpc.aio.Server (grpc is imported only when gRPC is served)
        self.proxy: PortProxy | None = None  # HAProxy on the one port, in front of the two listeners
        self.acceptor: PortAcceptor | None = None  # the one port's listener: each connection to the edge or HAProxy
        self.http1: AdoptedHttp1 | None = None  # the one port's HTTP/1.1 connections, served in this process
        self._private: Path | None = None  # the folder of the gRPC listener's unix socket, behind the proxy

    async def start(self) -> None:
        """Listen on every port; OSError (a port taken) leaves what started for :meth:`stop`."""
        settings, auth = self.settings, self.settings.auth()
        # with a token, every request goes through the core (where the gRPC edge checks it)
        if self.direct_paths and settings.grpc_limits.native_lanes and auth is None:
            self.lanes = open_lanes(self.service, MAX_DETAILS_BYTES)
            if self.lanes is not None:
                self.lanes.start()
        if settings.single_port and settings.http_port is not None:
            if await self._start_proxied_port(auth):
                return
            await self._start_single_port(auth)
            return
        if settings.grpc_port is not None:
            await self._start_grpc(f"{settings.host}:{settings.grpc_port}", auth, self.reuse_port)
        if settings.http_port is not None:
            self.http = HttpServer(self._rest_app(auth), settings.host, settings.http_port, settings.http_limits,
                                   listening_fd=self._listening_fd())
            await self.http.start()
            logger.info("HTTP endpoint on %s:%d (HTTP/1.1 and h2c)", settings.host, settings.http_port)

    async def _start_grpc(self, address: str, auth: TokenAuth | None, reuse_port: bool) -> None:
        """The gRPC server on ``address``, started."""
        from runtime.grpc.server import create_grpc_server  # grpc loads only when gRPC is served

        settings = self.settings
        self.grpc = create_grpc_server(self.service, address, settings.grpc_max_message_bytes, auth,
                                       settings.grpc_limits, reuse_port=reuse_port,
                                       restrictions=settings.grpc_restrictions,
                                       header_forward=header_forward(settings.grpc_header_forward), lanes=self.lanes)
        await self.grpc.start()
        logger.info("gRPC endpoint on %s", address)

    async def _start_proxied_port(self, auth: TokenAuth | None) -> bool:
        """The one port: its acceptor handing gRPC clients' connections to the native edge, HTTP/1.1 ones to this
        process's HTTP/1.1 server and the rest to HAProxy in front of the two-port mode's listeners on private
        addresses (``runtime/listen/``); in a front end, on the port's SO_REUSEPORT group. False, with nothing left
        started, where HAProxy is not installed or does not start (the caller then serves the port with
        hypercorn)."""
        from runtime.http.adopted import AdoptedHttp1
        from runtime.listen.port_acceptor import PortAcceptor
        from runtime.listen.port_proxy import PortProxy, haproxy_executable

        settings = self.settings
        executable = haproxy_executable()
        if executable is None:
            logger.warning("haproxy is not installed: the one port is served by hypercorn, at about a third of the "
                           "two ports' speed under load (scripts/setup.sh and the container image install haproxy)")
            return False
        assert settings.http_port is not None
        if self.reuse_port:  # a front end: the port's SO_REUSEPORT group, each front end with its own HAProxy
            port = reuse_port_listener(settings.host, settings.http_port, settings.http_limits.backlog)
        else:
            check_bindable(f"{settings.host}:{settings.http_port}")
            port = _listening_socket(settings.host, settings.http_port, settings.http_limits.backlog)
        private = Path(tempfile.mkdtemp(prefix="serverless-triton-private-"))
        self._private = private
        grpc_socket = private / "grpc.sock"
        await self._start_grpc(f"unix:{grpc_socket}", auth, False)
        rest = _listening_socket("127.0.0.1", 0, settings.http_limits.backlog)
        rest_port = rest.getsockname()[1]
        rest_app = self._rest_app(auth)  # one, for its bounds on answers being sent are the process's
        self.http = HttpServer(rest_app, "127.0.0.1", rest_port, settings.http_limits, listening_fd=rest.detach())
        await self.http.start()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proxy = PortProxy(executable, theirs.detach(), grpc_socket, f"127.0.0.1:{rest_port}",
                               settings.http_limits)
        try:
            await self.proxy.start()
        except (RuntimeError, OSError) as exc:
            logger.warning("%s: the one port is served by hypercorn instead", exc)
            await asyncio.gather(self.proxy.stop(0.0), *self._stops_behind_proxy(0.0))
            port.close()
            ours.close()
            shutil.rmtree(private, ignore_errors=True)
            self.proxy = self.http = self.grpc = None
            self._private = None
            return False
        self.http1 = AdoptedHttp1(rest_app, settings.http_limits)
        # the native edge takes a gRPC client's connections itself (grpcio's thread-pool server cannot)
        self.acceptor = PortAcceptor(port, getattr(self.grpc, "adopt_connection", None), self.http1.adopt, ours,
                                     self.http1.out_of_descriptors)
        self.acceptor.start()
        logger.info("HTTP endpoint on %s:%d (HTTP/1.1 and h2c), gRPC on the same port (haproxy)", settings.host,
                    settings.http_port)
        return True

    def _rest_app(self, auth: TokenAuth | None) -> Any:
        settings, limits = self.settings, self.settings.http_limits
        openai = openai_mounts(self.service, settings.max_request_bytes, limits.body_timeout, settings.openai)
        return create_http_app(self.service, settings.max_request_bytes, auth, settings.auth_exempt_health,
                               limits.body_timeout, settings.json_decode_budget,
                               UnsentBytes(limits.max_unsent_bytes, limits.send_timeout), settings.http_restrictions,
                               self.lanes,
                               header_forward(settings.http_header_forward), openai,
                               restriction_guard(settings.openai.restrictions))

    def _listening_fd(self) -> int | None:
        settings = self.settings
        if not self.reuse_port or settings.http_port is None:
            return None
        return reuse_port_listener(settings.host, settings.http_port, settings.http_limits.backlog).detach()

    async def _start_single_port(self, auth: TokenAuth | None) -> None:
        from runtime.grpc.asgi import GrpcAsgiApp
        from runtime.grpc.server import create_servicer
        from runtime.listen.single_port import SinglePortServer, route_by_content_type

        settings = self.settings
        servicer = create_servicer(self.service, settings.grpc_limits, header_forward(settings.grpc_header_forward))
        grpc_app = GrpcAsgiApp(servicer, settings.grpc_max_message_bytes,
                               auth, settings.grpc_restrictions, settings.grpc_limits.streams_max_bytes)
        assert settings.http_port is not None
        self.http = SinglePortServer(route_by_content_type(self._rest_app(auth), grpc_app), settings.host,
                                     settings.http_port, settings.http_limits, listening_fd=self._listening_fd())
        await self.http.start()
        logger.info("HTTP endpoint on %s:%d (HTTP/1.1 and h2c), gRPC on the same port", settings.host,
                    settings.http_port)

    @property
    def tasks(self) -> list[asyncio.Task]:
        """What ends if a listener stops on its own (the HTTP server's task, HAProxy's watch)."""
        tasks = [self.http.task] if self.http is not None and self.http.task is not None else []
        if self.proxy is not None and self.proxy.task is not None:
            tasks.append(self.proxy.task)
        return tasks

    def stops(self, timeout: float) -> list:
        """Awaitables that stop each adapter, draining its requests for at most ``timeout`` seconds (with the lanes,
        one that drains them all, the lanes around them)."""
        stops = [self._stop_proxied_port(timeout)] if self.proxy is not None else self._stops_behind_proxy(timeout)
        if self.lanes is not None:
            return [self.lanes.drain(stops, timeout)]
        return stops

    def _stops_behind_proxy(self, timeout: float) -> list:
        stops = [self.http.stop(timeout)] if self.http is not None else []
        if self.grpc is not None:
            stops.append(self.grpc.stop(timeout))
        return stops

    async def _stop_proxied_port(self, timeout: float) -> bool:
        """HAProxy first (no new connections; the requests under way finish through it), then the listeners behind
        it with what is left of ``timeout``; False if something was cut off."""
        assert self.proxy is not None
        started = time.monotonic()
        if self.acceptor is not None:
            self.acceptor.stop()
            logger.info("the port handed %d connection(s) to the gRPC edge, %d to its HTTP/1.1 server, %d to "
                        "haproxy", self.acceptor.to_edge, self.acceptor.to_http1, self.acceptor.to_proxy)
        http1_stop = self.http1.stop(timeout) if self.http1 is not None else asyncio.sleep(0, True)
        clean, http1_clean = await asyncio.gather(self.proxy.stop(timeout), http1_stop)
        clean = clean and http1_clean
        left = max(0.0, timeout - (time.monotonic() - started))
        results = await asyncio.gather(*self._stops_behind_proxy(left), return_exceptions=True)
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
        return clean and not any(result is False for result in results)
